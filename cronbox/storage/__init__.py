"""cronbox's sealed storage: PHI encrypted before it touches the disk, served by short-lived signed links.

    from cronbox import storage

    with sessions.begin() as session:                         # your transaction
        file_id = storage.put(session, upload_stream, filename="scan.pdf",
                              content_type="application/pdf", owner="patient:1842")
        grant_id = storage.grant(session, file_id, "patient:1842", expires_in=3600, max_uses=3)
    url = storage.signed_url(grant_id, ttl=300)               # "/files/<token>", audited
    link = storage.signed_url(grant_id, absolute=True)        # CRONBOX_BASE_URL + "/files/<token>"

Inside a host app (a request, a handler, a cron command under CRONBOX_APP) the
module-level functions use that app's store: its instance folder, its keys,
whatever the environment or working directory say later. Outside an app context
in a process with a host app they refuse (NoAppContext); the standalone app's
store is built from the .env settings once (`current()` says the order).
docs/sealed-format.md specifies the file format.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from cronbox.outbox.core.settings import Settings, load_settings

from cronbox.outbox.core import sealing
from cronbox.outbox.core.sealing import Sealer
from cronbox.outbox.core.engines import make_engine, session_factory
from cronbox.outbox.core.session_types import AnySession

# Every error the functions below raise (README, "Sealed files", says which and the HTTP answer for each).
from .errors import (BaseUrlMissing, GrantInvalid, IntegrityError, KeyFolderError, NoAppContext, NotFound,
                     StorageError, TooLarge, UnknownKey)

if TYPE_CHECKING:
    from .service import OpenedFile, Sealed, Storage

# Which Storage a module-level call uses, outside an app context: per process, never an app's.
_default: Storage | None = None  # configure()'s, or the standalone one built on first use
_pending: tuple[Settings, sessionmaker[Session] | None] | None = None  # use()'s settings, not built yet
_hosted = False  # a Cronbox extension was set up in this process (mark_hosted)
_sealer: Sealer | None = None  # the standalone store's payload sealer, from its settings (current_sealer)
_LAZY = ("OpenedFile", "Sealed", "Storage")


def __getattr__(name: str):
    """The service (ciphers: libsodium; signed tokens) loads on first use, not with the package: a
    tick that only sweeps, or a command that never seals, does not pay for it."""
    if name in _LAZY:
        from . import service
        return getattr(service, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def configure(settings: Settings | None = None, sessions: sessionmaker[Session] | None = None) -> Storage:
    """Make the Storage the module-level functions use outside an app context; returns it."""
    global _default, _pending, _sealer
    from .service import Storage

    settings = settings or load_settings()
    if sessions is None:
        sessions = session_factory(make_engine(settings, role="cron"))
    if _pending is None or _pending[0] is not settings:
        _sealer = None  # another store's settings: its sealer is made again from them
    _default, _pending = Storage(settings, sessions), None
    return _default


def use(settings: Settings, sessions: sessionmaker[Session] | None) -> None:
    """configure() with these settings on first use (a standalone command's runtime): the settings are
    the ones resolved at start, so a handler that later changes os.environ or the working directory
    does not move the keys; a command that never seals never loads the ciphers."""
    global _default, _pending, _sealer
    _default, _pending, _sealer = None, (settings, sessions), None


def mark_hosted() -> None:
    """A host app is set up in this process (Cronbox.init_app): from now on a module-level call outside
    an app context is refused (NoAppContext) rather than served from the environment's guess."""
    global _hosted
    _hosted = True


def current() -> Storage:
    """The Storage a module-level call uses.

    Inside an app context whose app set cronbox up (a request, a handler, a cron command under
    CRONBOX_APP or `flask --app`): that app's, from the settings its init_app resolved. Elsewhere the
    one configure() or use() gave. Elsewhere, in a process with a host app (a Cronbox extension set up,
    or CRONBOX_APP in the environment or .env), none: NoAppContext. Else the standalone app's, from the
    .env settings, resolved once and kept.
    """
    state = _app_state()
    if state is not None:
        return state.storage
    if _default is not None:
        return _default
    return configure(*_standalone())


def _standalone() -> tuple[Settings, sessionmaker[Session] | None]:
    """What the standalone store is (or will be) built from: configure()'s or use()'s, else the .env
    settings, resolved once and kept (as use() keeps them). NoAppContext in a process with a host app."""
    if _default is not None:
        return _default.settings, _default.sessions
    if _pending is None:
        if _hosted:
            raise NoAppContext()
        settings = load_settings()
        if settings.get("CRONBOX_APP"):
            raise NoAppContext()
        use(settings, None)
    assert _pending is not None
    return _pending


def _app_state():
    """cronbox's state of the current Flask app, when there is an app context and cronbox is set up on
    its app. Only a process that imported Flask can be in an app context: storage never imports it."""
    flask = sys.modules.get("flask")
    if flask is None or not flask.has_app_context():
        return None
    return flask.current_app.extensions.get("cronbox")


def current_sealer() -> Sealer:
    """The payload sealer of the store current() gives, from its settings alone (outbox.core.sealing
    asks this, inside record()'s and dispatch()'s transaction: set_resolver below). Building the Storage
    would check the app's schema on a connection of its own, which on SQLite waits on the caller's."""
    global _sealer
    state = _app_state()
    if state is not None:
        return state.sealer()
    if _sealer is None:
        from .payload_keys import sealer_of

        _sealer = sealer_of(_standalone()[0])
    return _sealer


sealing.set_resolver(current_sealer)


def put(session: AnySession, stream, *, filename: str, content_type: str, owner: str) -> str:
    """Seal `stream` (read to its end, constant memory) and add its row to `session`; returns the file id.

    `filename` and `content_type` are sealed with the file; `owner` is an opaque id (`patient:1842`),
    never a name. Raises `StorageError` for a bad argument, `KeyFolderError` for an unsafe key folder,
    `NoAppContext` outside an app context in a host process; a full disk is an `OSError` (`ENOSPC`).
    Nothing is committed: the row commits with `session`."""
    return current().put(session, stream, filename=filename, content_type=content_type, owner=owner)


def grant(session: AnySession, file_id: str, subject: str, *, expires_in: float = 3600, max_uses: int | None = None) -> str:
    """Let `subject` download `file_id` for `expires_in` seconds, at most `max_uses` times; returns the grant id.

    The grant's row is added to `session` (not committed). Raises `NotFound` for no such file,
    `StorageError` for a bad subject, `expires_in` or `max_uses`."""
    return current().grant(session, file_id, subject, expires_in=expires_in, max_uses=max_uses)


def revoke(session: AnySession, grant_id: str) -> bool:
    """End the grant `grant_id` in `session` (not committed): every link issued for it stops working at
    once. Returns whether it was still active. Raises `NotFound` for no such grant."""
    return current().revoke(session, grant_id)


def signed_url(grant_id: str, ttl: int = 300, *, session: Session | None = None, absolute: bool = False) -> str:
    """`/files/<token>` for the grant `grant_id`, valid `ttl` seconds (at most CRONBOX_URL_MAX_TTL); with
    `absolute=True` `<CRONBOX_BASE_URL>/files/<token>` (BaseUrlMissing when that is not set). With a
    `session`, the link's audit entry is added to it (else written in a transaction of its own).
    Raises `NotFound` for no such grant, `GrantInvalid` for one revoked, expired or used up,
    `StorageError` for a bad `ttl`."""
    return current().signed_url(grant_id, ttl, session=session, absolute=absolute)


def open_file(session: AnySession, file_id: str) -> OpenedFile:
    """Open the sealed file `file_id` (its row read through `session`) for reading in your own code, e.g. to
    attach it to a message; close() it after. Raises `NotFound` for no such file, `UnknownKey` when its
    master key is not in the key folder, `IntegrityError` when it fails authentication."""
    return current().open_file(session, file_id)


__all__ = [
    "BaseUrlMissing",
    "GrantInvalid",
    "IntegrityError",
    "KeyFolderError",
    "NoAppContext",
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
    "mark_hosted",
    "open_file",
    "put",
    "revoke",
    "signed_url",
    "use",
]
