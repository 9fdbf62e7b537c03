"""The two AEADs of the sealed format, with buffers reused across chunks.

Why libsodium's C functions are called directly (through PyNaCl's cffi `lib`)
rather than through `nacl.bindings.crypto_aead_*`: the public bindings allocate
a zeroed output buffer and then copy it into a new `bytes` on every call. On
64 KiB chunks that costs about a third of the throughput here (measured 3,000
vs 4,300 MB/s for AES-256-GCM). A `ChunkCipher` owns one output buffer and
fills it chunk after chunk; callers must consume (write or copy) each result
before the next call. PyNaCl is pinned, so the private module is a known one.

Hardware: libsodium's AES-256-GCM needs AES-NI, PCLMUL and AVX and refuses to
run otherwise. Sealing then uses XChaCha20-Poly1305; AES-256-GCM files are still
readable through OpenSSL (`cryptography`'s AESGCM), which has constant-time
software paths. `force_software_aes()` makes this host behave like one
without AES-NI, for tests and benchmarks.
"""
from __future__ import annotations

import contextlib

import nacl.bindings  # noqa: F401  (runs sodium_init(), which detects the CPU's features)
from nacl._sodium import ffi, lib

from .errors import IntegrityError, StorageError

AES_256_GCM = 0x01
XCHACHA20_POLY1305 = 0x02

NAMES = {AES_256_GCM: "aes-256-gcm", XCHACHA20_POLY1305: "xchacha20-poly1305"}
CODES = {name: code for code, name in NAMES.items()}
NONCE_SIZES = {AES_256_GCM: 12, XCHACHA20_POLY1305: 24}
KEY_SIZE = 32
TAG_SIZE = 16

_software_aes = False


def hardware_aes() -> bool:
    """True when libsodium's AES-256-GCM runs on this CPU (and is not disabled for a test)."""
    return not _software_aes and lib.crypto_aead_aes256gcm_is_available() == 1


@contextlib.contextmanager
def force_software_aes():
    """Behave like a CPU without AES-NI/AVX: seal with XChaCha20-Poly1305, read AES-GCM via OpenSSL."""
    global _software_aes
    previous, _software_aes = _software_aes, True
    try:
        yield
    finally:
        _software_aes = previous


def sealing_algorithm(setting: str) -> int:
    """The payload algorithm for new files under CRONBOX_SEAL_ALGORITHM (auto / a forced name)."""
    if setting == "auto":
        return AES_256_GCM if hardware_aes() else XCHACHA20_POLY1305
    code = CODES[setting]
    if code == AES_256_GCM and not hardware_aes():
        raise StorageError("CRONBOX_SEAL_ALGORITHM=aes-256-gcm, but this CPU lacks the AES-NI/PCLMUL/AVX "
                           "support libsodium needs; use auto (seals with xchacha20-poly1305 here)")
    return code


class ChunkCipher:
    """Seals or opens one chunk at a time under one key, into a buffer it reuses.

    `capacity` is the largest plaintext it will handle. Results are memoryviews
    of the internal buffer, valid until the next call.
    """

    def __init__(self, algorithm: int, key: bytes, capacity: int):
        if algorithm not in NAMES:
            raise IntegrityError(f"unknown algorithm 0x{algorithm:02x}")
        if len(key) != KEY_SIZE:
            raise ValueError("keys are 32 bytes")
        self.algorithm = algorithm
        self.nonce_size = NONCE_SIZES[algorithm]
        self._key = key
        self.capacity = capacity
        self._out = ffi.new("unsigned char[]", capacity + TAG_SIZE)
        self._view = memoryview(ffi.buffer(self._out))
        self._length = ffi.new("unsigned long long *")
        self._openssl = None
        if algorithm == AES_256_GCM:
            if hardware_aes():
                self._encrypt = lib.crypto_aead_aes256gcm_encrypt
                self._decrypt = lib.crypto_aead_aes256gcm_decrypt
            else:
                from cryptography.hazmat.primitives.ciphers.aead import AESGCM

                self._openssl = AESGCM(key)
        else:
            self._encrypt = lib.crypto_aead_xchacha20poly1305_ietf_encrypt
            self._decrypt = lib.crypto_aead_xchacha20poly1305_ietf_decrypt

    def seal(self, nonce: bytes, plaintext, ad: bytes) -> memoryview:
        """Ciphertext || tag of `plaintext` (bytes-like)."""
        if self._openssl is not None:
            # Sealing AES-GCM without AES-NI is refused by sealing_algorithm(); this path
            # exists for the test vectors, which must be reproducible on any CPU.
            return memoryview(self._openssl.encrypt(nonce, bytes(plaintext), ad))
        size = len(plaintext)
        self._check(nonce, size)  # libsodium writes size + TAG_SIZE bytes into the buffer: never past it
        rc = self._encrypt(self._out, self._length, ffi.from_buffer(plaintext), size, ad, len(ad),
                           ffi.NULL, nonce, self._key)
        if rc != 0:
            raise StorageError("encryption failed")
        return self._view[: self._length[0]]

    def _check(self, nonce: bytes, size: int) -> None:
        """What libsodium takes on trust (it reads nonce_size bytes of the nonce, writes size + tag
        bytes into the buffer): a caller's mistake must be an error, not memory past the end."""
        if size > self.capacity:
            raise ValueError(f"plaintext of {size} bytes is over this cipher's capacity of {self.capacity}")
        if len(nonce) != self.nonce_size:
            raise ValueError(f"nonce of {len(nonce)} bytes, not {self.nonce_size}")

    def open(self, nonce: bytes, sealed, ad: bytes) -> memoryview:
        """The plaintext of `sealed` (ciphertext || tag); IntegrityError if it does not authenticate."""
        size = len(sealed)
        if size < TAG_SIZE:
            raise IntegrityError("chunk shorter than its tag")
        if size - TAG_SIZE > self.capacity:  # a chunk longer than the format allows: never written past the buffer
            raise IntegrityError(f"chunk of {size} bytes is longer than {self.capacity + TAG_SIZE}")
        if len(nonce) != self.nonce_size:
            raise IntegrityError(f"nonce of {len(nonce)} bytes, not {self.nonce_size}")
        if self._openssl is not None:
            from cryptography.exceptions import InvalidTag

            try:
                return memoryview(self._openssl.decrypt(nonce, bytes(sealed), ad))
            except InvalidTag:
                raise IntegrityError("chunk does not authenticate") from None
        rc = self._decrypt(self._out, self._length, ffi.NULL, ffi.from_buffer(sealed), size, ad, len(ad),
                           nonce, self._key)
        if rc != 0:
            raise IntegrityError("chunk does not authenticate")
        return self._view[: self._length[0]]


def seal_once(algorithm: int, key: bytes, nonce: bytes, plaintext: bytes, ad: bytes) -> bytes:
    """One small message (a wrapped key, metadata): a fresh buffer is fine here."""
    return bytes(ChunkCipher(algorithm, key, len(plaintext)).seal(nonce, plaintext, ad))


def open_once(algorithm: int, key: bytes, nonce: bytes, sealed: bytes, ad: bytes) -> bytes:
    return bytes(ChunkCipher(algorithm, key, max(0, len(sealed) - TAG_SIZE)).open(nonce, sealed, ad))
