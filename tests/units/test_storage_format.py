"""The sealed format alone (no database): round trips, test vectors, and every tampering detected."""
from __future__ import annotations

import base64
import contextlib
import io
import json
import os

import pytest

from cronbox.storage import ciphers
from cronbox.storage.errors import IntegrityError
from cronbox.storage.format import (
    CHUNK_SIZE,
    SEALED_CHUNK,
    SealedReader,
    Sealer,
    hkdf_sha256,
    new_data_key,
    new_file_id,
    open_meta,
    seal_meta,
    unwrap_key,
    wrap_key,
)
from tests.vectors import make_vectors

AES, XCHACHA = ciphers.AES_256_GCM, ciphers.XCHACHA20_POLY1305
SIZES = [0, 1, CHUNK_SIZE - 1, CHUNK_SIZE, CHUNK_SIZE + 1, 3 * CHUNK_SIZE, 3 * CHUNK_SIZE + 1234]


def seal(data: bytes, algorithm: int, file_id: bytes, data_key: bytes, *, via: str = "fill") -> bytes:
    sink = io.BytesIO()
    sealer = Sealer(sink, file_id=file_id, data_key=data_key, algorithm=algorithm)
    if via == "fill":
        sealer.fill_from(io.BytesIO(data))
    else:  # odd write sizes, as a multipart parser delivers them
        for start in range(0, len(data), 7777):
            sealer.write(data[start:start + 7777])
    assert sealer.finish() == len(data)
    assert len(sink.getvalue()) == sealer.sealed_size
    return sink.getvalue()


def open_all(raw: bytes, file_id: bytes, data_key: bytes) -> bytes:
    reader = SealedReader(io.BytesIO(raw), file_id=file_id, data_key=data_key, size=len(raw))
    reader.authenticate_end()
    return b"".join(bytes(part) for part in reader)


@pytest.fixture
def ids():
    return new_file_id(), new_data_key()


def test_hkdf_matches_rfc5869_case_1():
    okm = hkdf_sha256(bytes([0x0B] * 22), bytes(range(13)), bytes(range(0xF0, 0xFA)), 42)
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                         "34007208d5b887185865")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("algorithm", [AES, XCHACHA])
@pytest.mark.parametrize("via", ["fill", "write"])
def test_round_trip(size, algorithm, via, ids):
    data = os.urandom(size)
    raw = seal(data, algorithm, *ids, via=via)
    assert open_all(raw, *ids) == data
    chunks = max(1, -(-size // CHUNK_SIZE))
    assert len(raw) == 26 + ciphers.NONCE_SIZES[algorithm] - 5 + size + 16 * chunks
    assert SealedReader(io.BytesIO(raw), file_id=ids[0], data_key=ids[1], size=len(raw)).size == size


@pytest.mark.parametrize("size", SIZES)
def test_software_fallback_reads_hardware_aes_files_and_seals_xchacha(size, ids):
    """A host without AES-NI: `auto` seals with XChaCha20-Poly1305, AES-GCM files open through OpenSSL."""
    data = os.urandom(size)
    hardware_sealed = seal(data, AES, *ids)
    with ciphers.force_software_aes():
        assert not ciphers.hardware_aes()
        assert ciphers.sealing_algorithm("auto") == XCHACHA
        assert open_all(hardware_sealed, *ids) == data
        software_sealed = seal(data, ciphers.sealing_algorithm("auto"), *ids)
        assert open_all(software_sealed, *ids) == data
        with pytest.raises(Exception, match="AES-NI"):
            ciphers.sealing_algorithm("aes-256-gcm")
    assert open_all(software_sealed, *ids) == data


def test_auto_uses_aes_gcm_where_the_cpu_has_it():
    if not ciphers.hardware_aes():
        pytest.skip("this CPU lacks AES-NI/AVX")
    assert ciphers.sealing_algorithm("auto") == AES
    assert ciphers.sealing_algorithm("xchacha20-poly1305") == XCHACHA


@pytest.mark.parametrize("algorithm", [AES, XCHACHA])
def test_two_seals_of_one_file_differ(algorithm):
    data = b"same plaintext" * 1000
    file_id = new_file_id()
    first = seal(data, algorithm, file_id, new_data_key())
    second = seal(data, algorithm, file_id, new_data_key())
    assert first != second and len(first) == len(second)


# --- test vectors --------------------------------------------------------------------------------

FIXTURE = json.loads(make_vectors.FIXTURE.read_text(encoding="utf-8"))
INPUTS = FIXTURE["inputs"]
FILE_ID = bytes.fromhex(INPUTS["file_id"])
DATA_KEY = bytes.fromhex(INPUTS["data_key"])


def test_vectors_fixture_spec_and_key_file_are_what_the_code_produces():
    assert make_vectors.build() == FIXTURE
    spec = make_vectors.SPEC.read_text(encoding="utf-8")
    assert make_vectors.markdown(FIXTURE) in spec
    key_file = make_vectors.KEY_FOLDER / FIXTURE["key_file"]["name"]
    assert [p.name for p in make_vectors.KEY_FOLDER.iterdir()] == [key_file.name]
    assert key_file.read_text(encoding="ascii") == FIXTURE["key_file"]["text"]


def test_vector_derived_values():
    derived = FIXTURE["derived"]
    master = bytes.fromhex(INPUTS["master_key"])
    wrapped = bytes.fromhex(derived["wrapped_key"])
    assert unwrap_key(master, INPUTS["key_id"], FILE_ID, wrapped) == DATA_KEY
    assert open_meta(DATA_KEY, FILE_ID, bytes.fromhex(derived["meta"])) == (INPUTS["name"], INPUTS["type"])


@pytest.mark.parametrize("vector", FIXTURE["vectors"], ids=[v["name"] for v in FIXTURE["vectors"]])
@pytest.mark.parametrize("software", [False, True], ids=["hardware", "software"])
def test_vector_opens_and_every_variant_fails(vector, software):
    sealed = base64.b64decode(vector["sealed_b64"])
    with ciphers.force_software_aes() if software else contextlib.nullcontext():
        assert open_all(sealed, FILE_ID, DATA_KEY) == make_vectors.plaintext_of(vector)
        for variant in vector["must_fail"]:
            with pytest.raises(IntegrityError):
                open_all(make_vectors.apply(sealed, variant), FILE_ID, DATA_KEY)


# --- tampering -----------------------------------------------------------------------------------

@pytest.fixture(params=[AES, XCHACHA], ids=["aes", "xchacha"])
def sealed_file(request, ids):
    data = os.urandom(3 * CHUNK_SIZE + 100)
    return request.param, data, seal(data, request.param, *ids), ids


def _fails(raw: bytes, ids) -> None:
    with pytest.raises(IntegrityError):
        open_all(raw, *ids)


def test_any_bit_flipped_in_the_header_is_detected(sealed_file):
    algorithm, _data, raw, ids = sealed_file
    header = 26 + ciphers.NONCE_SIZES[algorithm] - 5
    for byte in range(header):
        for bit in range(8):
            tampered = bytearray(raw)
            tampered[byte] ^= 1 << bit
            _fails(bytes(tampered), ids)


def test_any_bit_flipped_in_the_wrapped_key_is_detected():
    master, file_id, data_key = os.urandom(32), new_file_id(), new_data_key()
    wrapped = wrap_key(master, "enc-0001-aaaaaaaa", file_id, data_key)
    assert unwrap_key(master, "enc-0001-aaaaaaaa", file_id, wrapped) == data_key
    for byte in range(len(wrapped)):
        for bit in range(8):
            tampered = bytearray(wrapped)
            tampered[byte] ^= 1 << bit
            with pytest.raises(IntegrityError):
                unwrap_key(master, "enc-0001-aaaaaaaa", file_id, bytes(tampered))
    with pytest.raises(IntegrityError):
        unwrap_key(os.urandom(32), "enc-0001-aaaaaaaa", file_id, wrapped)  # wrong master key
    with pytest.raises(IntegrityError):
        unwrap_key(master, "enc-0002-aaaaaaaa", file_id, wrapped)  # relabelled key id
    with pytest.raises(IntegrityError):
        unwrap_key(master, "enc-0001-aaaaaaaa", new_file_id(), wrapped)  # moved to another row


def test_flipped_bits_in_chunk_bodies_and_tags(sealed_file):
    algorithm, _data, raw, ids = sealed_file
    header = len(raw) - (3 * CHUNK_SIZE + 100) - 4 * 16
    for offset in (header, header + 1000, header + SEALED_CHUNK - 1, header + SEALED_CHUNK + 5, len(raw) - 17,
                   len(raw) - 1):
        tampered = bytearray(raw)
        tampered[offset] ^= 0x80
        _fails(bytes(tampered), ids)


@pytest.mark.parametrize("cut", ["boundary", 1, 15, 16, 17])
def test_truncation(sealed_file, cut):
    algorithm, _data, raw, ids = sealed_file
    header = len(raw) - (3 * CHUNK_SIZE + 100) - 4 * 16
    shorter = raw[: header + 3 * SEALED_CHUNK] if cut == "boundary" else raw[:-cut]
    _fails(shorter, ids)


def test_truncation_at_every_chunk_boundary(sealed_file):
    algorithm, _data, raw, ids = sealed_file
    header = len(raw) - (3 * CHUNK_SIZE + 100) - 4 * 16
    for chunks in range(0, 4):
        _fails(raw[: header + chunks * SEALED_CHUNK], ids)


@pytest.mark.parametrize("junk", [b"\x00", bytes(range(16)), bytes(range(100, 117)), bytes(SEALED_CHUNK)],
                         ids=["1 byte", "16 bytes", "17 bytes", "a whole chunk"])
def test_appended_junk(sealed_file, junk):
    _algorithm, _data, raw, ids = sealed_file
    _fails(raw + junk, ids)


def _chunks(raw: bytes, header: int) -> list[bytes]:
    body = raw[header:]
    return [body[i:i + SEALED_CHUNK] for i in range(0, len(body), SEALED_CHUNK)]


def test_duplicated_reordered_and_dropped_chunks(sealed_file):
    algorithm, _data, raw, ids = sealed_file
    header = len(raw) - (3 * CHUNK_SIZE + 100) - 4 * 16
    head, (c0, c1, c2, last) = raw[:header], _chunks(raw, header)
    for body in ([c0, c0, c2, last], [c1, c0, c2, last], [c0, c2, c1, last], [c0, c1, c1, c2, last],
                 [c0, c2, last], [c0, c1, c2, c2]):
        _fails(head + b"".join(body), ids)


def test_chunks_spliced_from_another_file(ids):
    data = os.urandom(3 * CHUNK_SIZE)
    raw_a = seal(data, AES, *ids)
    other = (new_file_id(), new_data_key())
    raw_b = seal(data, AES, *other)
    header = len(raw_a) - len(data) - 3 * 16
    a, b = _chunks(raw_a, header), _chunks(raw_b, header)
    _fails(raw_a[:header] + a[0] + b[1] + a[2], ids)
    # Same data key reused by a bug: the header (nonce prefix, file id) in the AD still refuses it.
    same_key = seal(data, AES, ids[0], ids[1])
    _fails(raw_a[:header] + a[0] + _chunks(same_key, header)[1] + a[2], ids)


def test_a_file_opened_as_another_record_is_refused(ids):
    raw = seal(b"patient A", AES, *ids)
    with pytest.raises(IntegrityError, match="another record"):
        open_all(raw, new_file_id(), ids[1])


def test_files_shorter_than_their_header(sealed_file):
    algorithm, _data, raw, ids = sealed_file
    for length in range(0, 26 + ciphers.NONCE_SIZES[algorithm] - 5 + 16):
        _fails(raw[:length], ids)


def test_metadata_is_bound_to_its_file():
    file_id, data_key = new_file_id(), new_data_key()
    blob = seal_meta(data_key, file_id, "Jane Doe – HIV test.pdf", "application/pdf")
    assert b"Jane" not in blob and b"pdf" not in blob
    assert open_meta(data_key, file_id, blob) == ("Jane Doe – HIV test.pdf", "application/pdf")
    with pytest.raises(IntegrityError):
        open_meta(data_key, new_file_id(), blob)
    tampered = bytearray(blob)
    tampered[-1] ^= 1
    with pytest.raises(IntegrityError):
        open_meta(data_key, file_id, bytes(tampered))


def test_range_reads_decrypt_only_the_touched_chunks(ids, monkeypatch):
    data = os.urandom(5 * CHUNK_SIZE)
    raw = seal(data, AES, *ids)
    reader = SealedReader(io.BytesIO(raw), file_id=ids[0], data_key=ids[1], size=len(raw))
    opened = []
    original = reader.chunk
    monkeypatch.setattr(reader, "chunk", lambda index: opened.append(index) or original(index))
    start, stop = 2 * CHUNK_SIZE - 10, 3 * CHUNK_SIZE + 10
    assert b"".join(bytes(p) for p in reader.iter_range(start, stop)) == data[start:stop]
    assert opened == [1, 2, 3]


@pytest.mark.parametrize("software", [False, True], ids=["hardware", "software"])
@pytest.mark.parametrize("algorithm", [AES, XCHACHA])
def test_a_chunk_cipher_refuses_a_nonce_of_another_size_and_a_chunk_that_does_not_authenticate(algorithm, software):
    """The format's nonce size is checked by us (OpenSSL's AES-GCM would take 8 to 128 bytes); a short,
    tampered or wrongly keyed chunk is an IntegrityError; the cipher still works after each refusal."""
    key, nonce = os.urandom(32), os.urandom(ciphers.NONCE_SIZES[algorithm])
    with ciphers.force_software_aes() if software else contextlib.nullcontext():
        cipher = ciphers.ChunkCipher(algorithm, key)
        with pytest.raises(ValueError, match="nonce of 13 bytes"):
            cipher.seal(os.urandom(13), b"x" * 10, b"ad")
        sealed = bytes(cipher.seal(nonce, b"z" * 64, b"ad"))
        assert len(sealed) == 64 + ciphers.TAG_SIZE
        with pytest.raises(IntegrityError, match="nonce of 13 bytes"):
            cipher.open(os.urandom(13), sealed, b"ad")
        with pytest.raises(IntegrityError, match="shorter than its tag"):
            cipher.open(nonce, sealed[:15], b"ad")
        tampered = bytearray(sealed)
        tampered[3] ^= 1
        for bad in (bytes(tampered), sealed[:-1]):
            with pytest.raises(IntegrityError, match="does not authenticate"):
                cipher.open(nonce, bad, b"ad")
        with pytest.raises(IntegrityError, match="does not authenticate"):
            cipher.open(nonce, sealed, b"other ad")
        with pytest.raises(IntegrityError, match="does not authenticate"):
            ciphers.ChunkCipher(algorithm, os.urandom(32)).open(nonce, sealed, b"ad")
        assert bytes(cipher.open(nonce, sealed, b"ad")) == b"z" * 64
