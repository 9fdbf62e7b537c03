"""The two AEADs of the sealed format, through their libraries' public calls.

AES-256-GCM is OpenSSL's (`cryptography`'s `AESGCM`) on every CPU: one implementation for sealing
and opening, which uses AES-NI/VAES where the CPU has them (measured 12,700 MB/s on 64 KiB chunks
here, twice libsodium's) and constant-time software paths where it does not. XChaCha20-Poly1305 is
libsodium's through PyNaCl's public bindings (`nacl.bindings`); `cryptography` has no XChaCha.
Each call returns a fresh buffer (a chunk at a time, so memory stays bounded): an earlier version
called libsodium through PyNaCl's private cffi module into one reused buffer, which bought ~15% on
XChaCha and needed bounds checks to stay memory-safe; our rule forbids private names.

Which algorithm `auto` seals with: AES-256-GCM where libsodium would run it in hardware (AES-NI,
PCLMUL and AVX, or ARM's crypto extensions: asked through its public binding, which refuses with
`UnavailableError` otherwise), else XChaCha20-Poly1305, which is fast and constant-time in software.
AES-256-GCM files stay readable everywhere. `force_software_aes()` makes this host behave like one
without that support, for tests and benchmarks.
"""
from __future__ import annotations

import contextlib
import functools

import nacl.bindings
import nacl.exceptions
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import IntegrityError, StorageError

AES_256_GCM = 0x01
XCHACHA20_POLY1305 = 0x02

NAMES = {AES_256_GCM: "aes-256-gcm", XCHACHA20_POLY1305: "xchacha20-poly1305"}
CODES = {name: code for code, name in NAMES.items()}
NONCE_SIZES = {AES_256_GCM: 12, XCHACHA20_POLY1305: 24}
KEY_SIZE = 32
TAG_SIZE = 16

_software_aes = False


@functools.cache
def _cpu_has_aes() -> bool:
    """libsodium's answer, asked once: its AES-256-GCM binding refuses to run without the CPU support."""
    try:
        nacl.bindings.crypto_aead_aes256gcm_encrypt(b"", None, bytes(12), bytes(KEY_SIZE))
    except nacl.exceptions.UnavailableError:
        return False
    return True


def hardware_aes() -> bool:
    """True when this CPU runs AES-256-GCM in hardware (and that is not disabled for a test)."""
    return not _software_aes and _cpu_has_aes()


@contextlib.contextmanager
def force_software_aes():
    """Behave like a CPU without AES-NI/AVX: seal with XChaCha20-Poly1305 (AES-GCM files still open)."""
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
    """Seals or opens chunks under one key (AES-GCM's key schedule is set up once, not per chunk).

    Results are memoryviews of a new buffer per call, so slicing a chunk's plaintext copies nothing.
    """

    def __init__(self, algorithm: int, key: bytes):
        if algorithm not in NAMES:
            raise IntegrityError(f"unknown algorithm 0x{algorithm:02x}")
        if len(key) != KEY_SIZE:
            raise ValueError("keys are 32 bytes")
        self.algorithm = algorithm
        self.nonce_size = NONCE_SIZES[algorithm]
        self._key = key
        self._aes = AESGCM(key) if algorithm == AES_256_GCM else None

    def seal(self, nonce: bytes, plaintext, ad: bytes) -> memoryview:
        """Ciphertext || tag of `plaintext` (bytes-like)."""
        if len(nonce) != self.nonce_size:  # OpenSSL takes 8 to 128 bytes: only ours is the format's
            raise ValueError(f"nonce of {len(nonce)} bytes, not {self.nonce_size}")
        if self._aes is not None:
            return memoryview(self._aes.encrypt(nonce, plaintext, ad))
        return memoryview(nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(bytes(plaintext), ad, nonce,
                                                                                     self._key))

    def open(self, nonce: bytes, sealed, ad: bytes) -> memoryview:
        """The plaintext of `sealed` (ciphertext || tag); IntegrityError if it does not authenticate."""
        if len(sealed) < TAG_SIZE:
            raise IntegrityError("chunk shorter than its tag")
        if len(nonce) != self.nonce_size:
            raise IntegrityError(f"nonce of {len(nonce)} bytes, not {self.nonce_size}")
        try:
            if self._aes is not None:
                return memoryview(self._aes.decrypt(nonce, sealed, ad))
            return memoryview(nacl.bindings.crypto_aead_xchacha20poly1305_ietf_decrypt(bytes(sealed), ad, nonce,
                                                                                         self._key))
        except (InvalidTag, nacl.exceptions.CryptoError):
            raise IntegrityError("chunk does not authenticate") from None


def seal_once(algorithm: int, key: bytes, nonce: bytes, plaintext: bytes, ad: bytes) -> bytes:
    """One small message (a wrapped key, metadata)."""
    return bytes(ChunkCipher(algorithm, key).seal(nonce, plaintext, ad))


def open_once(algorithm: int, key: bytes, nonce: bytes, sealed: bytes, ad: bytes) -> bytes:
    return bytes(ChunkCipher(algorithm, key).open(nonce, sealed, ad))
