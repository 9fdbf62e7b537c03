"""The sealed payload envelope (docs/sealed-format.md, "Sealed payloads"): the test vector, written out
independently of the code, and the tamper set of the sealed files run against envelopes: every bit
flipped, every truncation, junk appended, every associated-data field changed: 100 % refused."""
from __future__ import annotations

import base64
import hashlib
import hmac
import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cronbox.outbox.core import sealing
from cronbox.outbox.core.sealing import PayloadIntegrityError

# The vector of docs/sealed-format.md ("Sealed payloads", "Test vector").
MASTER = bytes(range(32))
KEY_ID = "enc-0001-00000000"
INSTALL = bytes.fromhex("00112233445566778899aabbccddeeff")
SEAL_ID = bytes.fromhex("0f" * 16)
NONCE = bytes(range(12))
BODY = '{"text":"hello","to":"+15550100"}'
PAYLOAD_KEY = "1aa1afbdc385cc6de81ca80f97603159c54ddc063aaf0b69b5bf0e0d7a435113"
ENVELOPE = ("cbxp1:enc-0001-00000000:AAECAwQFBgcICQoLztm-PX_ZnAPP_p-vaRLKZKp9f6ow6uO5hLZeNURkP8T_yPO70s8n7Kdk-Mcw1DAzZQ")


def spec_key(master: bytes, key_id: str) -> bytes:
    """HKDF-SHA-256 (RFC 5869) as the spec writes it: no salt (32 zero bytes), one block of output."""
    prk = hmac.new(bytes(32), master, hashlib.sha256).digest()
    return hmac.new(prk, b"cronbox-payload/v1 key " + key_id.encode() + b"\x01", hashlib.sha256).digest()


def spec_ad(install: bytes, table: str, seal_id: bytes, key_id: str, name: str) -> bytes:
    return (b"cronbox-payload/v1" + bytes([len(install)]) + install + bytes([len(table)]) + table.encode()
            + seal_id + bytes([len(key_id)]) + key_id.encode() + struct.pack(">H", len(name.encode())) + name.encode())


def ad_of(**change) -> bytes:
    fields = {"install_id": INSTALL, "table": "cronbox_jobs", "seal_id": SEAL_ID, "key_id": KEY_ID,
              "name": "cronbox.sms", **change}
    return sealing.associated_data(**fields)


def opened(envelope: str, ad: bytes | None = None) -> str:
    key_id, raw = sealing.envelope_parts(envelope)
    return sealing.open_text(AESGCM(sealing.derive_key(MASTER, key_id)), raw, ad if ad is not None else ad_of())


def test_the_vector_is_what_the_spec_says_and_what_the_code_makes():
    assert spec_key(MASTER, KEY_ID).hex() == PAYLOAD_KEY == sealing.derive_key(MASTER, KEY_ID).hex()
    assert spec_ad(INSTALL, "cronbox_jobs", SEAL_ID, KEY_ID, "cronbox.sms") == ad_of()
    raw = base64.urlsafe_b64decode(ENVELOPE.split(":")[2] + "==")
    assert AESGCM(bytes.fromhex(PAYLOAD_KEY)).decrypt(raw[:12], raw[12:], ad_of()).decode() == BODY
    made = sealing.seal_text(AESGCM(sealing.derive_key(MASTER, KEY_ID)), KEY_ID, ad_of(), BODY, nonce=NONCE)
    assert made == ENVELOPE and opened(ENVELOPE) == BODY


# The result vector of docs/sealed-format.md ("Results and chains"): job 42's result, name empty.
RESULT_ID = bytes.fromhex("0000000000000000000000000000002a")
RESULT_BODY = '{"found":"ok"}'
RESULT_ENVELOPE = "cbxp1:enc-0001-00000000:AAECAwQFBgcICQoLztmsN3LD2hvXtJWoJwANsvttfNUq6vl2HQF68R30"


def test_the_result_vector_is_what_the_spec_says_and_what_the_code_makes():
    assert sealing.result_seal_id(42) == RESULT_ID.hex()
    ad = spec_ad(INSTALL, "cronbox_job_results", RESULT_ID, KEY_ID, "")
    assert ad == ad_of(table=sealing.RESULTS, seal_id=RESULT_ID, name="")
    raw = base64.urlsafe_b64decode(RESULT_ENVELOPE.split(":")[2] + "==")
    assert AESGCM(bytes.fromhex(PAYLOAD_KEY)).decrypt(raw[:12], raw[12:], ad).decode() == RESULT_BODY
    made = sealing.seal_text(AESGCM(sealing.derive_key(MASTER, KEY_ID)), KEY_ID, ad, RESULT_BODY, nonce=NONCE)
    assert made == RESULT_ENVELOPE
    for change in ({"seal_id": bytes.fromhex(sealing.result_seal_id(43))}, {"table": sealing.JOBS},
                   {"table": sealing.FLOWS}):  # another job's result, or taken for a payload or a flow
        with pytest.raises(PayloadIntegrityError):
            opened(RESULT_ENVELOPE, ad_of(**{"table": sealing.RESULTS, "seal_id": RESULT_ID, "name": "", **change}))


def _with_raw(raw: bytes) -> str:
    return f"cbxp1:{KEY_ID}:{base64.urlsafe_b64encode(raw).rstrip(b'=').decode()}"


def test_every_bit_flipped_in_nonce_ciphertext_and_tag_is_refused():
    raw = sealing.envelope_parts(ENVELOPE)[1]
    for index in range(len(raw)):
        for bit in range(8):
            altered = bytearray(raw)
            altered[index] ^= 1 << bit
            with pytest.raises(PayloadIntegrityError):
                opened(_with_raw(bytes(altered)))


def test_every_truncation_and_appended_junk_is_refused():
    raw = sealing.envelope_parts(ENVELOPE)[1]
    for length in range(len(raw)):
        with pytest.raises(PayloadIntegrityError):
            opened(_with_raw(raw[:length]))
    for cut in range(1, len(ENVELOPE)):
        with pytest.raises(PayloadIntegrityError):
            opened(ENVELOPE[:cut])
    for junk in (b"\x00", b"A" * 16, raw[-16:]):
        with pytest.raises(PayloadIntegrityError):
            opened(_with_raw(raw + junk))


@pytest.mark.parametrize("change", [
    {"install_id": bytes(16)},  # another database
    {"table": "cronbox_events"},  # another table
    {"seal_id": bytes(16)},  # another row
    {"key_id": "enc-0002-00000000"},  # another key id
    {"name": "cronbox.email"},  # another handler
])
def test_an_envelope_opened_as_another_row_table_database_key_or_handler_is_refused(change):
    with pytest.raises(PayloadIntegrityError):
        opened(ENVELOPE, ad_of(**change))


def test_a_swapped_key_id_in_the_envelope_is_refused_even_with_that_key():
    swapped = ENVELOPE.replace(KEY_ID, "enc-0002-00000000")
    with pytest.raises(PayloadIntegrityError):
        opened(swapped, ad_of(key_id="enc-0002-00000000"))


@pytest.mark.parametrize("text", [
    "cbxp1:", "cbxp1:enc-0001-00000000", "cbxp1:../../etc:AAAA", "cbxp1:sig-0001-00000000:" + "A" * 40,
    ENVELOPE + "=", ENVELOPE + "==", ENVELOPE.replace("-", "+"), ENVELOPE[:-1] + "R",  # non-canonical last digit
    ENVELOPE + "\n", " " + ENVELOPE,
])
def test_malformed_envelopes_are_refused_before_any_key_is_looked_up(text):
    with pytest.raises(PayloadIntegrityError):
        opened(text)


def test_what_a_person_sees():
    assert sealing.describe(ENVELOPE) == f"sealed ({len(BODY)} bytes, key {KEY_ID})"
    assert sealing.describe('{"a":1}') == "plaintext (7 characters)"
    assert not sealing.is_sealed('"cbxp1:a string payload"')  # JSON text never starts with c


def test_two_seals_of_one_payload_differ():
    aead = AESGCM(sealing.derive_key(MASTER, KEY_ID))
    assert sealing.seal_text(aead, KEY_ID, ad_of(), BODY) != sealing.seal_text(aead, KEY_ID, ad_of(), BODY)
