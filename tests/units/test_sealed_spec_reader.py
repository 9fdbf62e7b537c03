"""An independent reader (and writer) of the sealed format, written from docs/sealed-format.md alone.

Nothing from storage.* is used to read: key files, rows, headers and chunks are
parsed here as the spec states them, with `cryptography` (HKDF, AES-GCM,
ChaCha20-Poly1305) and a short HChaCha20, so what is tested is the spec against
the committed vectors, not the code against itself. Tests that hold cronbox's
code to a rule of the spec (the key ids it makes, the key it picks, the key
files it accepts, the row columns it ignores) say so in their names.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import nacl.bindings
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

VECTORS_DIR = Path(__file__).parents[1] / "vectors"
FIXTURE = json.loads((VECTORS_DIR / "sealed_v1.json").read_text(encoding="utf-8"))
INPUTS, DERIVED = FIXTURE["inputs"], FIXTURE["derived"]

CHUNK, SEALED_CHUNK, TAG = 65536, 65552, 16
NONCE_SIZES = {0x01: 12, 0x02: 24}
ALGORITHM_CODES = {"aes-256-gcm": 0x01, "xchacha20-poly1305": 0x02}


class Rejected(Exception):
    """The reader refused the input at one of the spec's reading steps."""

    def __init__(self, step: str, why: str):
        super().__init__(f"{step}: {why}")
        self.step = step


# --- primitives (Conventions) --------------------------------------------------------------------

def _quarter_round(s: list[int], a: int, b: int, c: int, d: int) -> None:
    def rotl(v: int, n: int) -> int:
        return ((v << n) & 0xFFFFFFFF) | (v >> (32 - n))

    s[a] = (s[a] + s[b]) & 0xFFFFFFFF; s[d] = rotl(s[d] ^ s[a], 16)  # noqa: E702
    s[c] = (s[c] + s[d]) & 0xFFFFFFFF; s[b] = rotl(s[b] ^ s[c], 12)  # noqa: E702
    s[a] = (s[a] + s[b]) & 0xFFFFFFFF; s[d] = rotl(s[d] ^ s[a], 8)  # noqa: E702
    s[c] = (s[c] + s[d]) & 0xFFFFFFFF; s[b] = rotl(s[b] ^ s[c], 7)  # noqa: E702


def hchacha20(key: bytes, nonce16: bytes) -> bytes:
    """draft-irtf-cfrg-xchacha-03 §2.2: ChaCha20's state with the 16 bytes as words 12-15, 20 rounds,
    no addition, words 0-3 and 12-15 out."""
    state = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574, *struct.unpack("<8I", key),
             *struct.unpack("<4I", nonce16)]
    for _ in range(10):
        for a, b, c, d in ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15),
                           (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14)):
            _quarter_round(state, a, b, c, d)
    return struct.pack("<8I", *state[0:4], *state[12:16])


def xchacha20_poly1305(key: bytes, nonce: bytes) -> tuple[ChaCha20Poly1305, bytes]:
    """The RFC 8439 AEAD under HChaCha20(key, nonce[0:16]), and its nonce 00000000 || nonce[16:24]."""
    return ChaCha20Poly1305(hchacha20(key, nonce[0:16])), b"\x00" * 4 + nonce[16:24]


def aead_seal(algorithm: int, key: bytes, nonce: bytes, plaintext: bytes, ad: bytes) -> bytes:
    if algorithm == 0x01:
        return AESGCM(key).encrypt(nonce, plaintext, ad)
    aead, sub_nonce = xchacha20_poly1305(key, nonce)
    return aead.encrypt(sub_nonce, plaintext, ad)


def aead_open(algorithm: int, key: bytes, nonce: bytes, sealed: bytes, ad: bytes, *, step: str) -> bytes:
    try:
        if algorithm == 0x01:
            return AESGCM(key).decrypt(nonce, sealed, ad)
        aead, sub_nonce = xchacha20_poly1305(key, nonce)
        return aead.decrypt(sub_nonce, sealed, ad)
    except InvalidTag:
        raise Rejected(step, "does not authenticate") from None


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(SHA256(), 32, salt, info).derive(ikm)


# --- key files -----------------------------------------------------------------------------------

KEY_ID = re.compile(r"(enc|sig)-([0-9]{4,9})-[0-9a-f]{8}")
KEY_TEXT = re.compile(rb"[A-Za-z0-9_-]{43}")


def parse_key_text(data: bytes) -> bytes:
    """43 base64url characters without padding, surrounding whitespace ignored, one spelling per key."""
    text = data.strip(b" \t\r\n")
    if not KEY_TEXT.fullmatch(text):
        raise ValueError("not 43 base64url characters")
    key = base64.urlsafe_b64decode(text + b"=")
    if base64.urlsafe_b64encode(key).rstrip(b"=") != text:
        raise ValueError("the last character's unused bits are not zero")
    return key


def read_key_folder(folder: Path) -> dict[str, bytes]:
    """Master keys by id: every `*.key` file, its name (a key id) minus `.key`; `sig` keys left out."""
    keys = {}
    for path in folder.iterdir():
        if not path.name.endswith(".key"):
            continue
        match = KEY_ID.fullmatch(path.name[:-4])
        if match is None:
            raise ValueError(f"{path.name} is not named after a key id")
        material = parse_key_text(path.read_bytes())
        if match[1] == "enc":
            keys[path.name[:-4]] = material
    return keys


def active_key_id(key_ids) -> str:
    """The highest sequence number, compared as an integer; on a tie the greater id in ASCII order."""
    return max(key_ids, key=lambda key_id: (int(KEY_ID.fullmatch(key_id)[2]), key_id))


# --- the database row ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    id: str  # 32 lowercase hex digits
    key_id: str
    wrapped_key: bytes  # raw
    meta: bytes  # raw
    size: int
    algorithm: str  # ignored by readers


def vector_row(vector: dict) -> Row:
    """The row of every vector, as the spec's vectors section states it."""
    return Row(INPUTS["file_id"], INPUTS["key_id"], bytes.fromhex(DERIVED["wrapped_key"]),
               bytes.fromhex(DERIVED["meta"]), vector["plaintext_length"], vector["algorithm"])


def wrap_ad(key_id: str, file_id: bytes) -> bytes:
    encoded = key_id.encode("ascii")
    return b"cronbox-sealed/v1 wrap" + bytes([len(encoded)]) + encoded + file_id


def unwrap(keys: dict[str, bytes], row: Row) -> bytes:
    if row.key_id not in keys or len(row.wrapped_key) != 72:
        raise Rejected("row", "no such master key, or a wrapped key of the wrong length")
    file_id = bytes.fromhex(row.id)
    return aead_open(0x02, keys[row.key_id], row.wrapped_key[:24], row.wrapped_key[24:],
                     wrap_ad(row.key_id, file_id), step="row")


def open_meta(data_key: bytes, row: Row) -> dict:
    file_id = bytes.fromhex(row.id)
    key = hkdf_sha256(data_key, file_id, b"cronbox-sealed/v1 meta")
    plain = aead_open(0x02, key, row.meta[:24], row.meta[24:], b"cronbox-sealed/v1 meta" + file_id, step="row")
    return json.loads(plain.decode("utf-8"))


# --- the sealed file -----------------------------------------------------------------------------

def header_length(algorithm: int) -> int:
    return 26 + NONCE_SIZES[algorithm] - 5


def layout(sealed_length: int, header: int) -> tuple[int, int, int]:
    """(chunks n, length of the last chunk, plaintext length) from the file's length (Reading, step 3)."""
    body = sealed_length - header
    if body < TAG:
        raise Rejected("length", "no complete chunk after the header")
    n = -(-body // SEALED_CHUNK)
    last = body - (n - 1) * SEALED_CHUNK
    if last < TAG or (n > 1 and last == TAG):
        raise Rejected("length", "impossible last chunk")
    return n, last, (n - 1) * CHUNK + last - TAG


class SpecReader:
    """Steps 1-4 of "Reading" on construction; step 5 on demand. `check_size=False` skips the
    comparison with the row's `size`, to show what the cryptography alone detects."""

    def __init__(self, sealed: bytes, row: Row, keys: dict[str, bytes], *, check_size: bool = True):
        self.raw = sealed
        data_key = unwrap(keys, row)  # 1. row
        self.meta = open_meta(data_key, row)
        file_id = bytes.fromhex(row.id)
        if len(sealed) < 9 or sealed[0:7] != b"cbxseal" or sealed[7] != 0x01 or sealed[8] not in NONCE_SIZES:
            raise Rejected("header", "magic, version or algorithm")  # 2. header
        self.algorithm, self.header = sealed[8], sealed[:header_length(sealed[8])]
        if len(self.header) < header_length(self.algorithm) or self.header[9] != 16:
            raise Rejected("header", "cut inside the header, or a chunk shift other than 16")
        if self.header[10:26] != file_id:
            raise Rejected("header", "the file id is not the row's")
        self.prefix = self.header[26:]
        self.chunks, self.last_length, self.size = layout(len(sealed), len(self.header))  # 3. length
        if check_size and self.size != row.size:
            raise Rejected("length", "the plaintext length is not the row's size")
        self.payload_key = hkdf_sha256(data_key, file_id, b"cronbox-sealed/v1 payload")
        self.last_plain = self._open(self.chunks - 1, step="last chunk")  # 4. last chunk

    def _open(self, index: int, *, step: str) -> bytes:
        last = index == self.chunks - 1
        start = len(self.header) + index * SEALED_CHUNK
        sealed = self.raw[start: start + (self.last_length if last else SEALED_CHUNK)]
        nonce = self.prefix + struct.pack(">IB", index, 1 if last else 0)
        return aead_open(self.algorithm, self.payload_key, nonce, sealed, self.header, step=step)

    def read(self, start: int, stop: int):
        """Plaintext [start, stop), one authenticated chunk at a time (step 5 for chunks not yet opened)."""
        index = start // CHUNK
        while start < stop:
            plain = self.last_plain if index == self.chunks - 1 else self._open(index, step=f"chunk {index}")
            yield plain[start - index * CHUNK: min(stop, (index + 1) * CHUNK) - index * CHUNK]
            start, index = (index + 1) * CHUNK, index + 1


def spec_seal(plaintext: bytes, algorithm: int, data_key: bytes, file_id: bytes, prefix: bytes) -> bytes:
    """A writer from the spec's Header and Payload sections."""
    header = b"cbxseal" + bytes([1, algorithm, 16]) + file_id + prefix
    key = hkdf_sha256(data_key, file_id, b"cronbox-sealed/v1 payload")
    pieces = [plaintext[i:i + CHUNK] for i in range(0, len(plaintext), CHUNK)] or [b""]
    return header + b"".join(
        aead_seal(algorithm, key, prefix + struct.pack(">IB", i, 1 if i == len(pieces) - 1 else 0), piece, header)
        for i, piece in enumerate(pieces))


def mutate(sealed: bytes, variant: dict) -> bytes:
    """A must-fail variant, from its JSON fields as the spec's vectors section describes them."""
    data, op = bytearray(sealed), variant["op"]
    if op == "flip":
        data[variant["byte"]] ^= 1 << variant["bit"]
    elif op == "truncate":
        del data[len(data) - variant["drop"]:]
    elif op == "truncate-to":
        del data[variant["length"]:]
    elif op == "append":
        data += bytes.fromhex(variant["hex"])
    elif op == "duplicate-chunk":  # header || chunk_0 || chunk_0
        h = header_length(data[8])
        data = data[:h + SEALED_CHUNK] + data[h:h + SEALED_CHUNK]
    else:
        raise AssertionError(op)
    return bytes(data)


def vector_keys() -> dict[str, bytes]:
    return read_key_folder(VECTORS_DIR / "keys")


def sealed_of(vector: dict) -> bytes:
    return base64.b64decode(vector["sealed_b64"])


VECTOR_IDS = [v["name"] for v in FIXTURE["vectors"]]


# --- primitives against their references ---------------------------------------------------------

def test_hchacha20_matches_the_drafts_test_vector():
    """draft-irtf-cfrg-xchacha-03 §2.2.1."""
    out = hchacha20(bytes(range(32)), bytes.fromhex("000000090000004a0000000031415927"))
    assert out.hex() == "82413b4227b27bfed30e42508a877d73a0f9e4d58a74a853c12ec41326d3ecdc"


@pytest.mark.parametrize("length", [0, 1, 17, 64, 1000])
def test_the_xchacha_construction_is_libsodiums(length):
    key, nonce = hashlib.sha256(b"key").digest(), hashlib.sha256(b"nonce").digest()[:24]
    plaintext, ad = bytes(k % 256 for k in range(length)), b"ad"
    ours = aead_seal(0x02, key, nonce, plaintext, ad)
    assert ours == nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(plaintext, ad, nonce, key)


# --- key files -----------------------------------------------------------------------------------

def test_the_vectors_key_file_is_what_the_spec_says():
    [path] = (VECTORS_DIR / "keys").iterdir()
    text = path.read_bytes()
    assert len(text) == 44 and text.endswith(b"\n") and b"=" not in text
    assert path.name == INPUTS["key_id"] + ".key"
    assert vector_keys() == {INPUTS["key_id"]: bytes.fromhex(INPUTS["master_key"])}


GOOD = base64.urlsafe_b64encode(bytes(range(250, 256)) * 5 + b"\xfb\xff").rstrip(b"=")  # has - and _
ZERO = b"A" * 43  # 32 zero bytes; its last character's 2 unused bits are zero
KEY_TEXTS = {
    "with LF": (GOOD + b"\n", True), "no LF": (GOOD, True), "CRLF": (GOOD + b"\r\n", True),
    "spaces and blank lines": (b"  " + GOOD + b" \n\n", True), "zero key": (ZERO + b"\n", True),
    "padding": (GOOD + b"=\n", False),
    "standard base64": (GOOD.replace(b"-", b"+").replace(b"_", b"/") + b"\n", False),
    "42 characters": (GOOD[:-1] + b"\n", False), "44 characters": (GOOD + b"A\n", False),
    "unused bits set": (ZERO[:-1] + b"B\n", False),  # decodes to the zero key too: a second spelling
    "line break inside": (GOOD[:20] + b"\n" + GOOD[20:] + b"\n", False), "empty": (b"", False),
}


@pytest.mark.parametrize("text, valid", KEY_TEXTS.values(), ids=KEY_TEXTS.keys())
def test_key_file_text_rules_and_cronbox_applies_them(tmp_path, text, valid):
    from cronbox.storage import keys
    from cronbox.storage.errors import KeyFolderError

    if valid:
        assert base64.urlsafe_b64encode(parse_key_text(text)).rstrip(b"=") == text.strip()
    else:
        with pytest.raises(ValueError):
            parse_key_text(text)
    folder = _key_folder(tmp_path, {"enc-0001-0a0b0c0d.key": text})
    if valid:
        assert keys.load(_settings(tmp_path, folder), create=False).master_key("enc-0001-0a0b0c0d") \
            == parse_key_text(text)
    else:
        with pytest.raises(KeyFolderError, match="does not hold a key"):
            keys.load(_settings(tmp_path, folder), create=False)


KEY = base64.urlsafe_b64encode(bytes(32)).rstrip(b"=") + b"\n"


@pytest.mark.parametrize("names, active", [
    (["enc-0001-0a0b0c0d", "enc-0002-00000000"], "enc-0002-00000000"),
    (["enc-0009-ffffffff", "enc-00010-00000000"], "enc-00010-00000000"),  # numbers, not text
    (["enc-0003-aaaaaaaa", "enc-0003-bbbbbbbb", "enc-0002-ffffffff"], "enc-0003-bbbbbbbb"),  # a tie
    (["enc-0001-0a0b0c0d", "sig-0007-00000000", "enc-000000003-00000000"], "enc-000000003-00000000"),
])
def test_the_active_key_rule_and_cronbox_picks_the_same(tmp_path, names, active):
    from cronbox.storage import keys

    folder = _key_folder(tmp_path, {f"{name}.key": KEY for name in names} | {".keys.lock": b"",
                                                                               ".enc-0001-x.tmp": b"junk"})
    assert active_key_id(read_key_folder(folder)) == active
    assert keys.load(_settings(tmp_path, folder), create=False).active.id == active


@pytest.mark.parametrize("name", ["enc-1-0a0b0c0d.key", "master.key", "enc-0001-0A0B0C0D.key",
                                  "enc-0001-0a0b0c0d0e.key", "enc-0000000001-0a0b0c0d.key", "ENC-0001-0a0b0c0d.key"])
def test_misnamed_key_files_are_refused_not_skipped_and_cronbox_refuses_them(tmp_path, name):
    from cronbox.storage import keys
    from cronbox.storage.errors import KeyFolderError

    folder = _key_folder(tmp_path, {"enc-0001-00000000.key": KEY, name: KEY})
    with pytest.raises(ValueError):
        read_key_folder(folder)
    with pytest.raises(KeyFolderError, match="is not named"):
        keys.load(_settings(tmp_path, folder))


def test_the_key_ids_and_files_cronbox_makes_follow_the_rule_and_fit_the_column(tmp_path):
    from cronbox.storage import keys
    from cronbox.storage.models import SealedFile

    settings = _settings(tmp_path, tmp_path / "keys")
    made = [keys.load(settings).active.id] + [keys.new_key(settings, keys.ENCRYPTION) for _ in range(3)]
    assert [int(KEY_ID.fullmatch(i)[2]) for i in made] == [1, 2, 3, 4]
    assert all(re.fullmatch(r"enc-[0-9]{4}-[0-9a-f]{8}", i) for i in made)
    ring = read_key_folder(settings.key_folder)
    assert set(ring) == set(made) and active_key_id(ring) == made[-1] == keys.load(settings).active.id
    for key_id in made:
        text = (settings.key_folder / f"{key_id}.key").read_bytes()
        assert len(text) == 44 and text[-1:] == b"\n" and parse_key_text(text) == ring[key_id]
    assert 22 <= SealedFile.__table__.c.key_id.type.length == 32  # the longest id (9 digits) fits


def test_cronbox_wraps_only_under_ids_of_the_rule():
    from cronbox.storage.errors import IntegrityError
    from cronbox.storage.format import unwrap_key, wrap_key

    file_id, key = bytes(16), bytes(32)
    for bad in ("enc-0001-aaaa", "sig-0001-0a0b0c0d", "x" * 40, "", "enc-0001-0a0b0c0d "):
        with pytest.raises(ValueError):
            wrap_key(key, bad, file_id, key)
        with pytest.raises(IntegrityError):
            unwrap_key(key, bad, file_id, bytes(72))
    wrapped = wrap_key(key, "enc-999999999-0a0b0c0d", file_id, key)
    assert unwrap({"enc-999999999-0a0b0c0d": key},
                  Row(file_id.hex(), "enc-999999999-0a0b0c0d", wrapped, b"", 0, "")) == key


def _key_folder(tmp_path: Path, files: dict[str, bytes]) -> Path:
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    for name, text in files.items():
        (folder / name).write_bytes(text)
        (folder / name).chmod(0o600)
    return folder


def _settings(tmp_path: Path, folder: Path):
    from cronbox.outbox.core.settings import load_settings

    return load_settings(app_root=tmp_path, environ={"CRONBOX_INSTANCE": str(tmp_path / "instance"),
                                                     "CRONBOX_KEYS": str(folder)})


# --- the vectors, read from the spec -------------------------------------------------------------

def test_derived_values_follow_from_the_inputs():
    data_key, file_id = bytes.fromhex(INPUTS["data_key"]), bytes.fromhex(INPUTS["file_id"])
    assert hkdf_sha256(data_key, file_id, b"cronbox-sealed/v1 payload").hex() == DERIVED["payload_key"]
    assert hkdf_sha256(data_key, file_id, b"cronbox-sealed/v1 meta").hex() == DERIVED["metadata_key"]
    row = vector_row(FIXTURE["vectors"][0])
    assert unwrap(vector_keys(), row) == data_key
    assert row.wrapped_key[:24].hex() == INPUTS["wrap_nonce"] and len(row.wrapped_key) == 72
    assert open_meta(data_key, row) == {"name": INPUTS["name"], "type": INPUTS["type"]}
    meta_plain = json.dumps({"name": INPUTS["name"], "type": INPUTS["type"]}, ensure_ascii=False,
                            separators=(",", ":"), sort_keys=True).encode()
    assert len(row.meta) == 24 + len(meta_plain) + 16


@pytest.mark.parametrize("vector", FIXTURE["vectors"], ids=VECTOR_IDS)
def test_each_vector_reads_and_the_spec_writer_reproduces_it(vector):
    sealed = sealed_of(vector)
    assert hashlib.sha256(sealed).hexdigest() == vector["sealed_sha256"] and len(sealed) == vector["sealed_length"]
    reader = SpecReader(sealed, vector_row(vector), vector_keys())
    plaintext = b"".join(reader.read(0, reader.size))
    assert len(plaintext) == vector["plaintext_length"] == reader.size
    assert hashlib.sha256(plaintext).hexdigest() == vector["plaintext_sha256"]
    if "plaintext_hex" in vector:
        assert plaintext.hex() == vector["plaintext_hex"]
    if vector["name"].endswith("/short"):
        assert plaintext == b"cronbox sealed v1\n"
    if vector["name"].endswith("/two-chunks"):
        assert plaintext == bytes(k % 251 for k in range(65553)) and reader.chunks == 2
    assert reader.header.hex() == vector["header"]
    assert reader.meta == {"name": INPUTS["name"], "type": INPUTS["type"]}
    prefix = bytes.fromhex(INPUTS["nonce_prefix"][vector["algorithm"]])
    assert spec_seal(plaintext, ALGORITHM_CODES[vector["algorithm"]], bytes.fromhex(INPUTS["data_key"]),
                     bytes.fromhex(INPUTS["file_id"]), prefix) == sealed


@pytest.mark.parametrize("vector", FIXTURE["vectors"], ids=VECTOR_IDS)
def test_the_algorithm_column_is_ignored(vector):
    other = "xchacha20-poly1305" if vector["algorithm"] == "aes-256-gcm" else "aes-256-gcm"
    for algorithm in (other, "", "rot13"):
        reader = SpecReader(sealed_of(vector), replace(vector_row(vector), algorithm=algorithm), vector_keys())
        assert reader.algorithm == ALGORITHM_CODES[vector["algorithm"]]


@pytest.mark.parametrize("vector", FIXTURE["vectors"], ids=VECTOR_IDS)
def test_every_must_fail_variant_is_rejected_at_its_stated_step(vector):
    sealed, row, keys = sealed_of(vector), vector_row(vector), vector_keys()
    steps = {variant["detected_by"] for variant in vector["must_fail"]}
    assert steps <= {"header", "length", "last chunk", "chunk 0"}
    for variant in vector["must_fail"]:
        tampered = mutate(sealed, variant)
        for check_size in (True, False):
            with pytest.raises(Rejected) as rejected:
                reader = SpecReader(tampered, row, keys, check_size=check_size)
                b"".join(reader.read(0, reader.size))
            if check_size:
                assert rejected.value.step == variant["detected_by"], variant
            else:  # without `size`, a length change is still refused: by the layout or the last chunk
                assert rejected.value.step in (variant["detected_by"], "last chunk"), variant


@pytest.mark.parametrize("vector", FIXTURE["vectors"], ids=VECTOR_IDS)
def test_an_altered_row_is_rejected_at_the_row_step(vector):
    sealed, row, keys = sealed_of(vector), vector_row(vector), vector_keys()
    flipped = lambda value, at: value[:at] + bytes([value[at] ^ 1]) + value[at + 1:]  # noqa: E731
    for changed in (replace(row, wrapped_key=flipped(row.wrapped_key, 0)),
                    replace(row, wrapped_key=flipped(row.wrapped_key, 71)),
                    replace(row, meta=flipped(row.meta, 30)),
                    replace(row, key_id="enc-0002-0a0b0c0d"),
                    replace(row, id="00112233445566778899aabbccddeefe")):
        with pytest.raises(Rejected) as rejected:
            SpecReader(sealed, changed, keys | {"enc-0002-0a0b0c0d": bytes.fromhex(INPUTS["master_key"])})
        assert rejected.value.step == "row"


def test_every_change_of_length_is_caught_by_the_length_step_alone():
    """The encoding is unique: no other length gives a possible layout with the same plaintext length."""
    [vector] = [v for v in FIXTURE["vectors"] if v["name"] == "aes-256-gcm/two-chunks"]
    h, size, sealed_length = 33, vector["plaintext_length"], vector["sealed_length"]
    for length in range(h, sealed_length + 2 * SEALED_CHUNK + 20):
        if length == sealed_length:
            assert layout(length, h)[2] == size
            continue
        try:
            assert layout(length, h)[2] != size, length
        except Rejected as rejected:
            assert rejected.step == "length"


# --- ranges and middle chunks ("What is detected, and when") ------------------------------------

@pytest.fixture(params=["aes-256-gcm", "xchacha20-poly1305"])
def three_chunks(request):
    """A three-chunk file sealed by the spec writer with the vectors' inputs, chunk 1 damaged."""
    algorithm = ALGORITHM_CODES[request.param]
    plaintext = bytes(k % 251 for k in range(2 * CHUNK + 500))
    sealed = spec_seal(plaintext, algorithm, bytes.fromhex(INPUTS["data_key"]), bytes.fromhex(INPUTS["file_id"]),
                       bytes.fromhex(INPUTS["nonce_prefix"][request.param]))
    h = header_length(algorithm)
    damaged = bytearray(sealed)
    damaged[h + SEALED_CHUNK + 1234] ^= 0x40
    row = Row(INPUTS["file_id"], INPUTS["key_id"], bytes.fromhex(DERIVED["wrapped_key"]),
              bytes.fromhex(DERIVED["meta"]), len(plaintext), request.param)
    return plaintext, bytes(damaged), row


def _received(reader: SpecReader, start: int, stop: int) -> tuple[bytes, str | None]:
    """What a reader releases for [start, stop) before it stops, and the step that stopped it."""
    out = b""
    try:
        for part in reader.read(start, stop):
            out += part
    except Rejected as rejected:
        return out, rejected.step
    return out, None


def test_a_damaged_middle_chunk_passes_steps_1_to_4_and_stops_a_read_when_reached(three_chunks):
    plaintext, damaged, row = three_chunks
    reader = SpecReader(damaged, row, vector_keys())  # header, length and last chunk all prove out
    assert reader.size == len(plaintext)
    assert _received(reader, 0, reader.size) == (plaintext[:CHUNK], "chunk 1")  # chunk 0 released, then stop
    assert _received(reader, CHUNK - 10, CHUNK + 10) == (plaintext[CHUNK - 10:CHUNK], "chunk 1")
    assert _received(reader, CHUNK + 5, CHUNK + 6) == (b"", "chunk 1")  # nothing of the bad chunk, ever


@pytest.mark.parametrize("start, stop", [(0, 10), (0, CHUNK), (2 * CHUNK, 2 * CHUNK + 500),
                                         (2 * CHUNK + 499, 2 * CHUNK + 500)])
def test_a_range_that_skips_the_damaged_chunk_is_served_intact_and_does_not_notice(three_chunks, start, stop):
    plaintext, damaged, row = three_chunks
    assert _received(SpecReader(damaged, row, vector_keys()), start, stop) == (plaintext[start:stop], None)
