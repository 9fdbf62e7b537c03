"""The points docs/sealed-format.md states for an independent reader (issue 24), each as the code
does it: which key-file errors refuse the whole folder, a row's key id checked before it names
anything, the ids' one spelling, the metadata's value types, the missing-key outcome, and chunk 0
of the two-chunk vectors in full."""
from __future__ import annotations

import base64
import json
import os
import struct

import pytest

from cronbox.storage import keys
from cronbox.storage.ciphers import CODES, seal_once, XCHACHA20_POLY1305
from cronbox.storage.errors import IntegrityError, KeyFolderError, UnknownKey
from cronbox.storage.format import CHUNK_SIZE, metadata_key, open_meta, payload_key
from tests.units.test_sealed_spec_reader import KEY, _key_folder, _settings
from tests.vectors import make_vectors

FIXTURE = json.loads(make_vectors.FIXTURE.read_text(encoding="utf-8"))
INPUTS = FIXTURE["inputs"]
FILE_ID = bytes.fromhex(INPUTS["file_id"])
DATA_KEY = bytes.fromhex(INPUTS["data_key"])
GOOD = "enc-0001-0a0b0c0d"


# --- chunk 0 of the two-chunk vectors ------------------------------------------------------------

@pytest.mark.parametrize("vector", [v for v in FIXTURE["vectors"] if v["name"].endswith("/two-chunks")],
                         ids=lambda v: v["name"])
def test_chunk_0_in_full_is_the_aead_of_the_first_65536_bytes(vector):
    """Computed here from the spec's formula with one AEAD call, not the code's Sealer."""
    header = bytes.fromhex(vector["header"])
    nonce = header[26:] + struct.pack(">I", 0) + b"\x00"  # nonce_prefix || u32be(0) || u8(last = 0)
    plaintext = make_vectors.plaintext_of(vector)[:CHUNK_SIZE]
    expected = seal_once(CODES[vector["algorithm"]], payload_key(DATA_KEY, FILE_ID), nonce, plaintext, header)
    chunk = bytes.fromhex(vector["chunk_0_hex"])
    assert len(chunk) == 65552 and chunk == expected
    sealed = base64.b64decode(vector["sealed_b64"])
    assert sealed[len(header):len(header) + 65552] == chunk
    spec = make_vectors.SPEC.read_text(encoding="utf-8")
    assert f"chunk 0 sha256 {vector['chunk_0_sha256']}" in spec and f"chunk 0 first {chunk[:32].hex()}" in spec


# --- a row's key id: checked before it names anything --------------------------------------------

@pytest.mark.parametrize("key_id", ["../keys/enc-0001-0a0b0c0d", "enc-0001-0a0b0c0d/../enc-0001-0a0b0c0d",
                                    "/etc/passwd", "sig-0001-0a0b0c0d", "ENC-0001-0A0B0C0D", "enc-0001-0A0B0C0D",
                                    "enc-1-0a0b0c0d", "enc-0001-0a0b0c0d ", "", None, 7])
def test_a_key_id_no_key_file_can_carry_is_an_altered_row_not_a_key_to_restore(tmp_path, key_id):
    folder = _key_folder(tmp_path, {f"{GOOD}.key": KEY, "sig-0001-0a0b0c0d.key": KEY})
    (tmp_path / "enc-0001-0a0b0c0d.key").write_bytes(KEY)  # what "../" would reach, were it a path
    ring = keys.load(_settings(tmp_path, folder), create=False)
    with pytest.raises(IntegrityError, match="not a master key id"):
        ring.master_key(key_id)


def test_a_well_formed_key_id_missing_from_the_folder_is_unknown_key(tmp_path):
    folder = _key_folder(tmp_path, {f"{GOOD}.key": KEY})
    ring = keys.load(_settings(tmp_path, folder), create=False)
    assert ring.master_key(GOOD) == bytes(32)
    with pytest.raises(UnknownKey, match="restore it from your backup"):
        ring.master_key("enc-0002-0a0b0c0d")


# --- key-file errors refuse the whole folder -------------------------------------------------------

@pytest.mark.parametrize("entry", ["folder", "fifo", "unreadable"])
def test_a_key_named_entry_that_is_not_a_readable_file_refuses_the_folder(tmp_path, entry):
    folder = _key_folder(tmp_path, {f"{GOOD}.key": KEY})
    odd = folder / "enc-0002-0a0b0c0d.key"
    if entry == "folder":
        odd.mkdir(mode=0o700)
    elif entry == "fifo":
        os.mkfifo(odd, 0o600)
    else:
        odd.write_bytes(KEY)
        odd.chmod(0o000)
        if os.access(odd, os.R_OK):
            pytest.skip("running as root: a 000 file is still readable")
    with pytest.raises(KeyFolderError, match=str(odd)):
        keys.load(_settings(tmp_path, folder), create=False)


# --- the metadata's value types ---------------------------------------------------------------

def sealed_meta(plain: bytes) -> bytes:
    nonce = bytes(24)
    return nonce + seal_once(XCHACHA20_POLY1305, metadata_key(DATA_KEY, FILE_ID), nonce, plain,
                             b"cronbox-sealed/v1 meta" + FILE_ID)


@pytest.mark.parametrize("plain", [
    b'{"name":1,"type":"application/pdf"}', b'{"name":"a.pdf","type":null}', b'{"name":["a"],"type":"x"}',
    b'{"name":"a.pdf"}', b'{"name":"a.pdf","type":"x","owner":"p:1"}', b'["a.pdf","x"]', b'"a.pdf"',
    b'{"name":"a.pdf","type":"x"', b'\xff\xfe', b""])
def test_metadata_other_than_two_text_values_is_an_integrity_error(plain):
    with pytest.raises(IntegrityError, match="sealed metadata"):
        open_meta(DATA_KEY, FILE_ID, sealed_meta(plain))


def test_metadata_as_a_writer_makes_it_opens():
    assert open_meta(DATA_KEY, FILE_ID, sealed_meta('{"name":"","type":"text/plain"}'.encode())) == ("", "text/plain")
    assert open_meta(DATA_KEY, FILE_ID, sealed_meta('{"name":"é.pdf","type":"x"}'.encode())) == ("é.pdf", "x")


# --- an id's one spelling ----------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", [INPUTS["file_id"].upper(), INPUTS["file_id"] + "\n", " " + INPUTS["file_id"],
                                      INPUTS["file_id"][:8] + "-" + INPUTS["file_id"][8:], "{" + INPUTS["file_id"] + "}",
                                      INPUTS["file_id"][:-1], INPUTS["file_id"] + "0", None])
def test_a_file_id_has_one_spelling(spelling):
    from cronbox.storage.vault import valid_id

    assert valid_id(INPUTS["file_id"]) and not valid_id(spelling)
