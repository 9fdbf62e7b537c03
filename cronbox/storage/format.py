"""The sealed file format, version 1 (docs/sealed-format.md is the specification).

Everything here is pure: bytes and file objects in, bytes out. Where files live,
which key is active and which row a file belongs to is decided elsewhere
(vault.py, keys.py, service.py). Every MUST of the spec is enforced in this
module; the comments name the attack each check stops.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from dataclasses import dataclass

from .ciphers import AES_256_GCM, NONCE_SIZES, TAG_SIZE, XCHACHA20_POLY1305, ChunkCipher, open_once, seal_once
from .errors import IntegrityError, StorageError, TooLarge
from .key_ids import is_master_key_id

MAGIC = b"cbxseal"
VERSION = 1
CHUNK_SHIFT = 16
CHUNK_SIZE = 1 << CHUNK_SHIFT  # plaintext bytes per chunk
SEALED_CHUNK = CHUNK_SIZE + TAG_SIZE
MAX_CHUNKS = 1 << 32  # the chunk index is a u32 in the nonce
FILE_ID_SIZE = 16
DATA_KEY_SIZE = 32
FIXED_HEADER = len(MAGIC) + 3  # magic, version, algorithm, chunk shift
WRAP_NONCE_SIZE = META_NONCE_SIZE = 24


_PAYLOAD_INFO = b"cronbox-sealed/v1 payload"
_META_INFO = b"cronbox-sealed/v1 meta"
_WRAP_AD = b"cronbox-sealed/v1 wrap"
_META_AD = b"cronbox-sealed/v1 meta"


# --- derivations -------------------------------------------------------------------------------

def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF (RFC 5869) with SHA-256: extract, then expand to `length` bytes."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    block, out, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def payload_key(data_key: bytes, file_id: bytes) -> bytes:
    return hkdf_sha256(data_key, file_id, _PAYLOAD_INFO)


def metadata_key(data_key: bytes, file_id: bytes) -> bytes:
    return hkdf_sha256(data_key, file_id, _META_INFO)


def new_file_id() -> bytes:
    return os.urandom(FILE_ID_SIZE)


def new_data_key() -> bytes:
    return os.urandom(DATA_KEY_SIZE)


# --- header ------------------------------------------------------------------------------------

def prefix_size(algorithm: int) -> int:
    """Nonce prefix length: the nonce minus the u32 chunk index and the last-chunk flag."""
    return NONCE_SIZES[algorithm] - 5


@dataclass(frozen=True)
class Header:
    algorithm: int
    file_id: bytes
    nonce_prefix: bytes

    def pack(self) -> bytes:
        return MAGIC + bytes([VERSION, self.algorithm, CHUNK_SHIFT]) + self.file_id + self.nonce_prefix

    @property
    def size(self) -> int:
        return FIXED_HEADER + FILE_ID_SIZE + len(self.nonce_prefix)

    def nonce(self, index: int, last: bool) -> bytes:
        return self.nonce_prefix + struct.pack(">IB", index, 1 if last else 0)


def header_size(algorithm: int) -> int:
    return FIXED_HEADER + FILE_ID_SIZE + prefix_size(algorithm)


def read_header(stream) -> Header:
    """Parse and check a header; IntegrityError for anything a v1 writer would not produce."""
    fixed = _read_exactly(stream, FIXED_HEADER)
    if len(fixed) < FIXED_HEADER or fixed[: len(MAGIC)] != MAGIC:
        raise IntegrityError("not a sealed file (bad magic or shorter than its header)")
    version, algorithm, shift = fixed[len(MAGIC):]
    if version != VERSION:
        raise IntegrityError(f"unknown sealed-file version {version}")
    if algorithm not in (AES_256_GCM, XCHACHA20_POLY1305):
        raise IntegrityError(f"unknown algorithm 0x{algorithm:02x}")
    if shift != CHUNK_SHIFT:
        # The shift sizes our buffers before anything is authenticated: never trust another one.
        raise IntegrityError(f"unsupported chunk shift {shift}")
    rest = _read_exactly(stream, FILE_ID_SIZE + prefix_size(algorithm))
    if len(rest) < FILE_ID_SIZE + prefix_size(algorithm):
        raise IntegrityError("shorter than its header")
    return Header(algorithm, rest[:FILE_ID_SIZE], rest[FILE_ID_SIZE:])


def _read_exactly(stream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = stream.read(size - len(data))
        if not more:
            break
        data += more
    return data


@dataclass(frozen=True)
class Layout:
    """Where chunks are in a sealed file of a given length, and how long its plaintext is."""

    header_size: int
    chunks: int
    last_sealed: int  # length of the last chunk, tag included

    @classmethod
    def of(cls, header_size: int, sealed_size: int) -> "Layout":
        body = sealed_size - header_size
        if body < TAG_SIZE:
            raise IntegrityError("truncated: no complete chunk after the header")
        chunks = -(-body // SEALED_CHUNK)
        last = body - (chunks - 1) * SEALED_CHUNK
        # A last chunk of only a tag after full chunks is not a v1 encoding (the empty last
        # chunk is reserved for the empty file): someone cut or padded the file.
        if last < TAG_SIZE or (chunks > 1 and last == TAG_SIZE):
            raise IntegrityError("truncated or extended: the last chunk has an impossible length")
        if chunks > MAX_CHUNKS:
            raise IntegrityError("more chunks than a u32 index can count")
        return cls(header_size, chunks, last)

    @property
    def plaintext_size(self) -> int:
        return (self.chunks - 1) * CHUNK_SIZE + self.last_sealed - TAG_SIZE

    def offset(self, index: int) -> int:
        return self.header_size + index * SEALED_CHUNK

    def sealed_length(self, index: int) -> int:
        return self.last_sealed if index == self.chunks - 1 else SEALED_CHUNK


def sealed_size(plaintext_size: int, algorithm: int) -> int:
    chunks = max(1, -(-plaintext_size // CHUNK_SIZE))
    return header_size(algorithm) + plaintext_size + chunks * TAG_SIZE


# --- wrapped data key and sealed metadata (stored in the database row) ------------------------

def _wrap_ad(key_id: str, file_id: bytes) -> bytes:
    encoded = key_id.encode("ascii")
    return _WRAP_AD + bytes([len(encoded)]) + encoded + file_id


def wrap_key(master_key: bytes, key_id: str, file_id: bytes, data_key: bytes, *, nonce: bytes | None = None) -> bytes:
    """Data key sealed under a master key, bound to the key id and the file id (72 bytes)."""
    if not is_master_key_id(key_id):
        raise ValueError(f"{key_id!r} is not a master key id (enc-<4 to 9 digits>-<8 hex digits>)")
    nonce = nonce or os.urandom(WRAP_NONCE_SIZE)
    return nonce + seal_once(XCHACHA20_POLY1305, master_key, nonce, data_key, _wrap_ad(key_id, file_id))


def unwrap_key(master_key: bytes, key_id: str, file_id: bytes, wrapped: bytes) -> bytes:
    if not is_master_key_id(key_id):
        # No key file can carry this id: the row was altered (the AD would refuse it anyway).
        raise IntegrityError("the row's key id is not a master key id")
    if len(wrapped) != WRAP_NONCE_SIZE + DATA_KEY_SIZE + TAG_SIZE:
        raise IntegrityError("wrapped key has the wrong length")
    try:
        return open_once(XCHACHA20_POLY1305, master_key, wrapped[:WRAP_NONCE_SIZE], wrapped[WRAP_NONCE_SIZE:],
                         _wrap_ad(key_id, file_id))
    except IntegrityError:
        raise IntegrityError(f"wrapped key does not open with master key {key_id} "
                             "(wrong key file under that id, or the row was altered)") from None


def seal_meta(data_key: bytes, file_id: bytes, name: str, content_type: str, *, nonce: bytes | None = None) -> bytes:
    plain = json.dumps({"name": name, "type": content_type}, ensure_ascii=False, separators=(",", ":"),
                       sort_keys=True).encode("utf-8")
    nonce = nonce or os.urandom(META_NONCE_SIZE)
    return nonce + seal_once(XCHACHA20_POLY1305, metadata_key(data_key, file_id), nonce, plain, _META_AD + file_id)


def open_meta(data_key: bytes, file_id: bytes, blob: bytes) -> tuple[str, str]:
    """(file name, content type); IntegrityError when the sealed metadata was altered."""
    if len(blob) < META_NONCE_SIZE + TAG_SIZE:
        raise IntegrityError("sealed metadata is too short")
    plain = open_once(XCHACHA20_POLY1305, metadata_key(data_key, file_id), blob[:META_NONCE_SIZE],
                      blob[META_NONCE_SIZE:], _META_AD + file_id)
    try:
        meta = json.loads(plain.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        raise IntegrityError("sealed metadata is not UTF-8 JSON") from None
    # Exactly the object a writer makes: a reader must not guess at other shapes (docs/sealed-format.md).
    if not (isinstance(meta, dict) and meta.keys() == {"name", "type"}
            and isinstance(meta["name"], str) and isinstance(meta["type"], str)):
        raise IntegrityError('sealed metadata is not {"name": <text>, "type": <text>}')
    return meta["name"], meta["type"]


# --- payload -----------------------------------------------------------------------------------

def _write_all(sink, data) -> None:
    view = memoryview(data)
    while view:
        written = sink.write(view)
        if written is None:
            raise StorageError("the sink would block")
        view = view[written:]


class Sealer:
    """Seals a plaintext stream into `sink` chunk by chunk, holding at most two chunks.

    A full chunk is held back until at least one more byte arrives, because only
    then is it known not to be the last one (its nonce carries the last-chunk
    flag). Feed it with `write()` (any sizes) or `fill_from(stream)` (reads
    straight into the chunk buffers), then call `finish()` once.
    """

    def __init__(self, sink, *, file_id: bytes, data_key: bytes, algorithm: int, nonce_prefix: bytes | None = None):
        self._sink = sink
        self.header = Header(algorithm, file_id, nonce_prefix or os.urandom(prefix_size(algorithm)))
        if len(self.header.nonce_prefix) != prefix_size(algorithm) or len(file_id) != FILE_ID_SIZE:
            raise ValueError("bad nonce prefix or file id length")
        self._ad = self.header.pack()
        self._cipher = ChunkCipher(algorithm, payload_key(data_key, file_id))
        self._buffers = (bytearray(CHUNK_SIZE), bytearray(CHUNK_SIZE))
        self._current = 0
        self._fill = 0
        self._held: int | None = None  # index of a full buffer waiting to learn whether it is last
        self._index = 0
        self.size = 0
        self.finished = False
        _write_all(sink, self._ad)

    def _seal(self, buffer: bytearray, length: int, last: bool) -> None:
        if self._index >= MAX_CHUNKS:
            raise StorageError("file too large: the chunk index would wrap and repeat nonces")
        sealed = self._cipher.seal(self.header.nonce(self._index, last), memoryview(buffer)[:length], self._ad)
        _write_all(self._sink, sealed)
        self._index += 1

    def _release_held(self) -> None:
        if self._held is not None:
            self._seal(self._buffers[self._held], CHUNK_SIZE, last=False)
            self._held = None

    def _added(self, count: int) -> None:
        self._fill += count
        self.size += count
        if self._fill == CHUNK_SIZE:
            self._held, self._current, self._fill = self._current, self._current ^ 1, 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        position = 0
        while position < len(view):
            self._release_held()
            take = min(CHUNK_SIZE - self._fill, len(view) - position)
            self._buffers[self._current][self._fill: self._fill + take] = view[position: position + take]
            position += take
            self._added(take)
        return len(view)

    def fill_from(self, stream, limit: int | None = None) -> int:
        """Read `stream` to its end into the chunk buffers; TooLarge past `limit` bytes."""
        readinto = getattr(stream, "readinto", None)
        while True:
            target = memoryview(self._buffers[self._current])[self._fill:]
            if readinto is not None:
                got = readinto(target)
            else:
                data = stream.read(len(target))
                got = len(data)
                target[:got] = data
            if not got:
                return self.size
            if limit is not None and self.size + got > limit:
                raise TooLarge(limit)
            if self._held is not None:
                # Bytes arrived after a full chunk: it was not the last one. (The new bytes
                # sit in the other buffer, so sealing the held one overwrites nothing.)
                self._release_held()
            self._added(got)

    def finish(self) -> int:
        """Seal the last chunk (flag set); returns the plaintext size."""
        if self.finished:
            raise StorageError("sealer already finished")
        if self._held is not None:
            self._seal(self._buffers[self._held], CHUNK_SIZE, last=True)
            self._held = None
        else:
            self._seal(self._buffers[self._current], self._fill, last=True)
        self.finished = True
        return self.size

    @property
    def sealed_size(self) -> int:
        return sealed_size(self.size, self.header.algorithm)


class SealedReader:
    """Opens chunks of one sealed file on demand, authenticating each before returning it.

    `stream` is a seekable binary file (ideally unbuffered: chunks are read
    straight into a reused buffer). Each result is a memoryview of that chunk's
    own plaintext.
    """

    def __init__(self, stream, *, file_id: bytes, data_key: bytes, size: int | None = None):
        self._stream = stream
        stream.seek(0)
        self.header = read_header(stream)
        if self.header.file_id != file_id:
            # Two sealed files swapped between records, or a file copied over another.
            raise IntegrityError("the sealed file belongs to another record (file id mismatch)")
        if size is None:
            size = os.fstat(stream.fileno()).st_size
        self.layout = Layout.of(self.header.size, size)
        self._ad = self.header.pack()
        self._cipher = ChunkCipher(self.header.algorithm, payload_key(data_key, file_id))
        self._in = bytearray(SEALED_CHUNK)
        self._last_plain: bytes | None = None

    @property
    def size(self) -> int:
        return self.layout.plaintext_size

    def chunk(self, index: int) -> memoryview:
        layout = self.layout
        if not 0 <= index < layout.chunks:
            raise IndexError(index)
        length = layout.sealed_length(index)
        target = memoryview(self._in)[:length]
        self._stream.seek(layout.offset(index))
        got = 0
        while got < length:
            count = self._stream.readinto(target[got:])
            if not count:
                raise IntegrityError("the file ended early (changed while reading?)", chunk=index)
            got += count
        try:
            return self._cipher.open(self.header.nonce(index, index == layout.chunks - 1), target, self._ad)
        except IntegrityError:
            raise IntegrityError("chunk does not authenticate", chunk=index) from None

    def authenticate_end(self) -> None:
        """Open the last chunk: proves the file was not cut or extended. Its plaintext is kept."""
        if self._last_plain is None:
            self._last_plain = bytes(self.chunk(self.layout.chunks - 1))

    def iter_range(self, start: int, stop: int):
        """Plaintext bytes [start, stop), chunk by chunk, decrypting only the chunks touched."""
        if not 0 <= start <= stop <= self.size:
            raise ValueError("range outside the file")
        index = start // CHUNK_SIZE
        while start < stop:
            base = index * CHUNK_SIZE
            if index == self.layout.chunks - 1 and self._last_plain is not None:
                plain = memoryview(self._last_plain)
            else:
                plain = self.chunk(index)
            yield plain[start - base: min(stop, base + CHUNK_SIZE) - base]
            start = base + CHUNK_SIZE
            index += 1

    def __iter__(self):
        return self.iter_range(0, self.size)
