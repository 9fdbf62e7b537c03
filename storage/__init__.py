"""cronbox's sealed storage: PHI encrypted before it touches the disk, served by short-lived signed links.

    import storage

    with sessions.begin() as session:                         # your transaction
        file_id = storage.put(session, upload_stream, filename="scan.pdf",
                              content_type="application/pdf", owner="patient:1842")
        grant_id = storage.grant(session, file_id, "patient:1842", expires_in=3600, max_uses=3)
    url = storage.signed_url(grant_id, ttl=300)               # "/files/<token>", audited
    link = storage.signed_url(grant_id, absolute=True)        # CRONBOX_BASE_URL + "/files/<token>"

The module-level functions use the process's configured Storage: create_app()
and every `python -m cron storage ...` command configure it; elsewhere call
`storage.configure(settings, sessions)` once (or it is built from the .env
settings on first use). docs/sealed-format.md specifies the file format.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from outbox.core.settings import Settings, load_settings

from outbox.core.db import make_engine, session_factory

# Every error the functions below raise (README, "Sealed files", says which and the HTTP answer for each).
from .errors import (BaseUrlMissing, GrantInvalid, IntegrityError, KeyFolderError, NotFound, StorageError, TooLarge,
                     UnknownKey)
from .models import SealedFile
from .vault import valid_id

if TYPE_CHECKING:
    from .service import OpenedFile, Sealed, Storage

_default: Storage | None = None
_LAZY = ("OpenedFile", "Sealed", "Storage")


def __getattr__(name: str):
    """The service (ciphers: libsodium; signed tokens) loads on first use, not with the package: a
    tick that only sweeps, or a command that never seals, does not pay for it."""
    if name in _LAZY:
        from . import service
        return getattr(service, name)
    raise AttributeError(f"module 'storage' has no attribute {name!r}")


def configure(settings: Settings | None = None, sessions: sessionmaker[Session] | None = None) -> Storage:
    """Make the Storage the module-level functions use; returns it."""
    global _default
    from .service import Storage

    settings = settings or load_settings()
    if sessions is None:
        sessions = session_factory(make_engine(settings, role="cron"))
    _default = Storage(settings, sessions)
    return _default


def current() -> Storage:
    return _default if _default is not None else configure()


def put(session: Session, stream, *, filename: str, content_type: str, owner: str) -> str:
    """Seal `stream` (read to its end, constant memory) and add its row to `session`; returns the file id."""
    return current().put(session, stream, filename=filename, content_type=content_type, owner=owner)


def grant(session: Session, file_id: str, subject: str, *, expires_in: float = 3600, max_uses: int | None = None) -> str:
    """Let `subject` download `file_id` for `expires_in` seconds, at most `max_uses` times; returns the grant id."""
    return current().grant(session, file_id, subject, expires_in=expires_in, max_uses=max_uses)


def revoke(session: Session, grant_id: str) -> bool:
    return current().revoke(session, grant_id)


def signed_url(grant_id: str, ttl: int = 300, *, session: Session | None = None, absolute: bool = False) -> str:
    """`/files/<token>` for the grant, valid `ttl` seconds (at most CRONBOX_URL_MAX_TTL); with `absolute=True`
    `<CRONBOX_BASE_URL>/files/<token>` (BaseUrlMissing when that is not set)."""
    return current().signed_url(grant_id, ttl, session=session, absolute=absolute)


def open_file(session: Session, file_id: str) -> OpenedFile:
    """Open a sealed file for reading in your own code (e.g. to attach it to a message); close() it after."""
    row = session.get(SealedFile, file_id) if valid_id(file_id) else None
    if row is None:
        raise NotFound(f"no file {file_id}")
    return current().open(row)


__all__ = [
    "BaseUrlMissing",
    "GrantInvalid",
    "IntegrityError",
    "KeyFolderError",
    "NotFound",
    "OpenedFile",
    "Sealed",
    "Storage",
    "StorageError",
    "TooLarge",
    "UnknownKey",
    "configure",
    "current",
    "grant",
    "open_file",
    "put",
    "revoke",
    "signed_url",
]
