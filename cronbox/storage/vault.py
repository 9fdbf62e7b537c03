"""Sealed files on the local disk: where each lives, how it is written, and what is left over.

    <instance>/private/3f/3f9a…c1.sealed        a complete sealed file (0600; folders 0700)
    <instance>/private/3f/3f9a…c1.5b2e….tmp     one being written

A file is written under a temporary name in its final folder, fsynced, renamed
into place and the folder fsynced: a process killed at any instruction (LVE
SIGKILL, no `finally`) leaves no file or a whole one, never a short file under
the final name. Only sealed bytes ever reach the disk.

Leftovers are expected and harmless: temporary files of killed writers, and
sealed files whose database row never committed (the caller rolled back or
died). `scan()` lists them for `storage sweep`, which removes those older than
a grace period.
"""
from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from cronbox.outbox.core.settings import Settings

from .errors import IntegrityError, KeyFolderError, NotFound

_ID = re.compile(r"[0-9a-f]{32}")
_SEALED = re.compile(r"^([0-9a-f]{32})\.sealed$")
_TEMPORARY = re.compile(r"^([0-9a-f]{32})\.[0-9a-f]{8}\.tmp$")


def valid_id(file_id: str) -> bool:
    """32 lowercase hex digits and nothing else (fullmatch: `$` would let a trailing newline through)."""
    return isinstance(file_id, str) and _ID.fullmatch(file_id) is not None


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PendingFile:
    """A sealed file being written: an unbuffered, O_EXCL, 0600 file under a temporary name."""

    def __init__(self, final: Path):
        self.final = final
        self.temporary = final.with_name(f"{final.stem}.{secrets.token_hex(4)}.tmp")
        fd = os.open(self.temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.stream = os.fdopen(fd, "wb", buffering=0)

    def commit(self) -> None:
        """Make the file durable under its final name."""
        os.fsync(self.stream.fileno())
        self.stream.close()
        os.rename(self.temporary, self.final)
        _fsync_folder(self.final.parent)

    def discard(self) -> None:
        if not self.stream.closed:
            self.stream.close()
        try:
            self.temporary.unlink()
        except FileNotFoundError:
            pass


@dataclass(frozen=True)
class Leftover:
    path: Path
    file_id: str
    temporary: bool
    mtime: float


def check_outside_web_roots(path: Path, settings: Settings, what: str) -> None:
    """Refuse a private folder (sealed files, keys) inside a folder the web server serves."""
    real = path.resolve()
    for root in settings.web_roots:
        root = root.resolve()
        if real == root or real.is_relative_to(root):
            raise KeyFolderError(f"{what} {real} is inside the web root {root}: a web server could serve it; "
                                 "move it (CRONBOX_INSTANCE / CRONBOX_KEYS) outside every public folder")


class Vault:
    def __init__(self, settings: Settings):
        self.root = settings.sealed_dir
        check_outside_web_roots(self.root, settings, "the private files folder")

    def path(self, file_id: str) -> Path:
        if not valid_id(file_id):
            raise NotFound(f"{file_id!r} is not a file id")
        return self.root / file_id[:2] / f"{file_id}.sealed"

    def create(self, file_id: str) -> PendingFile:
        final = self.path(file_id)
        for folder in (self.root, final.parent):
            folder.mkdir(mode=0o700, exist_ok=True, parents=True)
        return PendingFile(final)

    def open(self, file_id: str):
        """The sealed file, unbuffered (chunks are read straight into a reused buffer)."""
        try:
            return open(self.path(file_id), "rb", buffering=0)
        except FileNotFoundError:
            raise IntegrityError("the sealed file is missing from the disk") from None

    def remove(self, file_id: str) -> bool:
        try:
            self.path(file_id).unlink()
            return True
        except FileNotFoundError:
            return False

    def scan(self) -> Iterator[Leftover]:
        """Every sealed and temporary file under the root (one folder at a time: bounded memory)."""
        if not self.root.is_dir():
            return
        for folder in sorted(self.root.iterdir()):
            if not folder.is_dir() or len(folder.name) != 2:
                continue
            with os.scandir(folder) as entries:
                for entry in entries:
                    sealed, temporary = _SEALED.match(entry.name), _TEMPORARY.match(entry.name)
                    match = sealed or temporary
                    if match and entry.is_file(follow_symlinks=False):
                        yield Leftover(Path(entry.path), match.group(1), temporary is not None,
                                       entry.stat(follow_symlinks=False).st_mtime)
