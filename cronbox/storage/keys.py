"""Master (encryption) keys and URL-signing keys, one small file each in the key folder.

    <keys>/enc-0001-3f9a2c1b.key     32 random bytes: 43 base64url characters, no padding, LF
    <keys>/sig-0001-8e02d4a7.key

The file name without ".key" is the key id (stored in each file row as
`key_id`; the one rule for ids is key_ids.KEY_ID, docs/sealed-format.md "Key
files"). The sequence number orders keys of a kind: the encryption key with the
highest one is the active one (it wraps new data keys); signing keys are handed to itsdangerous
oldest to newest, so the newest signs and older ones still verify links issued
before a rotation. Encryption and signing keys never share material: a leaked
signing key forges links (still checked against grants) but opens no file.

Safety: the folder and every key file must belong to this account and be
unreadable by group and others (a shared host has neighbours), and must not be
inside a web root (a mis-configured server would serve them). Both are checked
whenever keys are loaded, and by create_app() at start-up.

Keys are generated on first use under a file lock (two web processes starting
at once must not each make an "active" key), written to a temporary file,
fsynced and linked into place, and announced loudly: a lost master key is lost
PHI, so it must be backed up the moment it exists.
"""
from __future__ import annotations

import base64
import logging
import os
import re
import secrets
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import filelock

from cronbox.outbox.core.settings import Settings

from .errors import IntegrityError, KeyFolderError, UnknownKey
from .key_ids import KEY_ID, MAX_SEQUENCE, is_master_key_id
from .vault import check_outside_web_roots

log = logging.getLogger("cronbox")

ENCRYPTION, SIGNING = "enc", "sig"
KEY_BYTES = 32
KEY_SUFFIX = ".key"
# Exactly the text a writer puts in a key file once its final LF is removed: one spelling per key.
_KEY_TEXT = re.compile(rb"[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class Key:
    kind: str
    id: str
    sequence: int
    material: bytes = field(repr=False)


@dataclass(frozen=True)
class KeyRing:
    folder: Path
    encryption: dict[str, Key]
    signing: tuple[Key, ...]  # oldest first
    stamp: tuple  # folder_stamp() when read: any key file added, removed or rewritten changes it

    @property
    def active(self) -> Key:
        return max(self.encryption.values(), key=lambda k: (k.sequence, k.id))

    def master_key(self, key_id: str) -> bytes:
        """The master key a row names. An id no key file could carry (a `sig-` id, `../x`, upper case) is
        an altered row, not a key to restore: IntegrityError, and never a path (the ring was read whole)."""
        if not is_master_key_id(key_id):
            raise IntegrityError("the row's key id is not a master key id (enc-<4 to 9 digits>-<8 hex digits>)")
        try:
            return self.encryption[key_id].material
        except KeyError:
            raise UnknownKey(f"master key {key_id} is not in {self.folder} (restore it from your backup)") from None

    @property
    def signing_keys(self) -> list[bytes]:
        return [key.material for key in self.signing]


def _check_private(path: Path, what: str) -> None:
    info = path.stat()
    if info.st_uid != os.geteuid():
        raise KeyFolderError(f"{what} {path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        fix = "700" if stat.S_ISDIR(info.st_mode) else "600"
        raise KeyFolderError(f"{what} {path} is accessible to group or others (mode {stat.S_IMODE(info.st_mode):o}); "
                             f"run: chmod {fix} {path}")


def check_key_folder(settings: Settings) -> None:
    """Start-up check: refuse an unsafe key folder (one that does not exist yet is fine)."""
    folder = settings.key_folder
    check_outside_web_roots(folder, settings, "the key folder")
    if folder.exists():
        _read(folder)


def _read(folder: Path) -> KeyRing:
    _check_private(folder, "the key folder")
    encryption: dict[str, Key] = {}
    signing: list[Key] = []
    for path in sorted(folder.iterdir()):
        if not path.name.endswith(KEY_SUFFIX):
            continue  # the lock file, temporary files of a writer
        match = KEY_ID.fullmatch(path.name[: -len(KEY_SUFFIX)])
        if not match:
            # Ignoring it would hide a restored but renamed key, and with no encryption key
            # left load() would make a new one: refuse instead.
            raise KeyFolderError(f"key file {path} is not named <enc|sig>-<4 to 9 digits>-<8 hex digits>.key; "
                                 "a key's file name is its id: restore it under its original name")
        _check_private(path, "key file")
        if not path.is_file():  # a folder or a FIFO under a key's name: reading it would fail or block
            raise KeyFolderError(f"key file {path} is not a regular file")
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise KeyFolderError(f"key file {path} cannot be read: {exc.strerror}") from None
        material = _decode(text)
        if material is None:
            raise KeyFolderError(f"key file {path} does not hold a key: expected 43 base64url characters "
                                 "(A-Z a-z 0-9 - _, no padding) and a newline")
        key = Key(match["kind"], path.name[: -len(KEY_SUFFIX)], int(match["sequence"]), material)
        if key.kind == ENCRYPTION:
            encryption[key.id] = key
        else:
            signing.append(key)
    signing.sort(key=lambda k: (k.sequence, k.id))
    return KeyRing(folder, encryption, tuple(signing), _stamp(folder))


def encode(material: bytes) -> bytes:
    """A key file's content: base64url (RFC 4648 section 5) without padding, then LF."""
    return base64.urlsafe_b64encode(material).rstrip(b"=") + b"\n"


def _decode(text: bytes) -> bytes | None:
    """The 32 bytes of a key file, or None. Surrounding whitespace (a key pasted back from a backup) is
    accepted; anything else, padding and non-canonical last characters included, is not."""
    text = text.strip(b" \t\r\n")
    if not _KEY_TEXT.fullmatch(text):
        return None
    material = base64.urlsafe_b64decode(text + b"=")
    return material if encode(material).rstrip(b"\n") == text else None


def _stamp(folder: Path) -> tuple:
    with os.scandir(folder) as entries:
        return tuple(sorted((entry.name, entry.stat().st_mtime_ns, entry.stat().st_size, entry.inode())
                            for entry in entries if entry.name.endswith(KEY_SUFFIX)))


def folder_stamp(settings: Settings) -> tuple | None:
    """Cheap fingerprint of the key files (one scandir): tells a running process to re-read them."""
    try:
        return _stamp(settings.key_folder)
    except FileNotFoundError:
        return None


def _lock(folder: Path) -> filelock.FileLock:
    return filelock.FileLock(str(folder / ".keys.lock"), timeout=60, mode=0o600)


def load(settings: Settings, *, create: bool = True) -> KeyRing:
    """The key ring; on first use (no encryption or no signing key yet) generate the missing ones."""
    folder = settings.key_folder
    check_outside_web_roots(folder, settings, "the key folder")
    if not folder.exists():
        if not create:
            raise KeyFolderError(f"the key folder {folder} does not exist")
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # the umask can only remove bits
    ring = _read(folder)
    if (ring.encryption and ring.signing) or not create:
        return ring
    with _lock(folder):
        ring = _read(folder)
        made = []
        if not ring.encryption:
            made.append(_write_new(folder, ENCRYPTION, ring))
        if not ring.signing:
            made.append(_write_new(folder, SIGNING, ring))
        ring = _read(folder)
    for key_id in made:
        announce(folder, key_id)
    return ring


def new_key(settings: Settings, kind: str) -> str:
    """Add a key of `kind` (it becomes the active encryption key / the signing key); returns its id."""
    ring = load(settings)
    with _lock(ring.folder):
        key_id = _write_new(ring.folder, kind, _read(ring.folder))
    announce(ring.folder, key_id)
    return key_id


def _write_new(folder: Path, kind: str, ring: KeyRing) -> str:
    existing = ring.encryption.values() if kind == ENCRYPTION else ring.signing
    sequence = max((k.sequence for k in existing), default=0) + 1
    if sequence > MAX_SEQUENCE:
        raise KeyFolderError(f"no {kind} key sequence number is left after {MAX_SEQUENCE} (ids have 4 to 9 digits)")
    key_id = f"{kind}-{sequence:04d}-{secrets.token_hex(4)}"
    final = folder / f"{key_id}{KEY_SUFFIX}"
    temporary = folder / f".{key_id}.{secrets.token_hex(4)}.tmp"
    text = encode(os.urandom(KEY_BYTES))
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temporary, final)  # fails rather than replace an existing key
    finally:
        temporary.unlink()
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return key_id


def announce(folder: Path, key_id: str) -> None:
    what = "master (encryption) key" if key_id.startswith(ENCRYPTION) else "URL-signing key"
    message = (f"NEW {what} {key_id} written to {folder}. BACK IT UP NOW, away from this server "
               f"(password manager, offline copy): "
               + ("without it every file sealed under it is lost for good." if key_id.startswith(ENCRYPTION)
                  else "losing it only invalidates links already issued."))
    log.warning("keys: %s", message)
    print(f"cronbox: {message}", file=sys.stderr)
