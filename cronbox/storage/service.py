"""The sealed-storage service: one object per process tying settings, keys, the vault and the database.

Writes follow the outbox's rule: rows go into the caller's session and are
never committed here. The sealed file is on disk (renamed into place) before
its row is added, so a committed row always has its file; a file whose row
never commits is an orphan that `storage sweep` removes later.

`signed_url()` is the one call that may open its own short transaction: an
issued link must be audited even if the caller's transaction rolls back. Pass
`session=` to issue within yours instead (required on SQLite while your own
write transaction is open, as SQLite allows one writer).
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from cronbox.outbox.core import clock
from cronbox.outbox.core.settings import Settings
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.core.session_types import AnySession
from cronbox.outbox.core.text import NAME_MAX, is_utf8

from . import audit, ciphers, grants, keys
from .display import has_unshowable
from .errors import BaseUrlMissing, GrantInvalid, IntegrityError, NotFound, StorageError, TooLarge
from .format import SealedReader, Sealer, new_data_key, new_file_id, open_meta, seal_meta, unwrap_key, wrap_key
from .keys import KeyRing
from .models import Grant, SealedFile
from .tokens import Tokens
from .vault import PendingFile, Vault, valid_id

log = logging.getLogger("cronbox")

MAX_NAME = 255
MAX_TYPE = 127


def owner_text(owner) -> str:
    """An owner reference: opaque text (never a name), checked the same way everywhere."""
    return _text(owner, "the owner", NAME_MAX)


def _text(value, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value) > limit or has_unshowable(value) or not is_utf8(value):
        raise StorageError(f"{what} must be non-empty UTF-8 text of at most {limit} characters without control or "
                           "bidi-formatting characters")
    return value


@dataclass(frozen=True)
class Sealed:
    """A sealed file complete on disk, not yet recorded: `Storage.add()` puts its row in a session."""

    file_id: str
    algorithm: str
    key_id: str
    wrapped_key: bytes
    meta: bytes
    size: int
    sealed_size: int


class SealingWriter:
    """Seals what is written into it into a new file, never holding more than two chunks.

    Used directly as the stream factory of a multipart upload (Werkzeug writes
    each part's bytes into it), or fed from a readable stream with `fill_from`.
    Ends with `finish()` (the file is durable under its final name) or
    `discard()` (nothing remains).
    """

    def __init__(self, storage: "Storage", *, filename: str, content_type: str, limit: int | None = None):
        if not isinstance(filename, str) or len(filename) > MAX_NAME or not is_utf8(filename):
            raise StorageError(f"the file name must be UTF-8 text of at most {MAX_NAME} characters "
                               "(os.fsdecode leaves lone surrogates of bytes that were not UTF-8)")
        self.filename = filename  # kept as given (sealed); cleaned where it is replayed (Content-Disposition)
        self.content_type = _text(content_type, "the content type", MAX_TYPE)
        self.limit = limit
        self.file_id = new_file_id().hex()
        binary_id = bytes.fromhex(self.file_id)
        data_key = new_data_key()
        active = storage.keyring().active
        self.key_id = active.id
        self.wrapped_key = wrap_key(active.material, active.id, binary_id, data_key)
        self.meta = seal_meta(data_key, binary_id, self.filename, self.content_type)
        self.algorithm = ciphers.sealing_algorithm(storage.settings.seal_algorithm)
        self._pending: PendingFile = storage.vault.create(self.file_id)
        try:
            self._sealer = Sealer(self._pending.stream, file_id=binary_id, data_key=data_key, algorithm=self.algorithm)
        except BaseException:
            self._pending.discard()
            raise

    def write(self, data) -> int:
        if self.limit is not None and self._sealer.size + len(data) > self.limit:
            raise TooLarge(self.limit)
        return self._sealer.write(data)

    def fill_from(self, stream) -> int:
        return self._sealer.fill_from(stream, self.limit)

    def seek(self, offset: int, whence: int = 0) -> int:
        """Werkzeug rewinds a finished part's container; there is nothing to rewind in a sealer."""
        return 0

    @property
    def size(self) -> int:
        return self._sealer.size

    def finish(self) -> Sealed:
        try:
            size = self._sealer.finish()
            self._pending.commit()
        except BaseException:
            self._pending.discard()
            raise
        return Sealed(self.file_id, ciphers.NAMES[self.algorithm], self.key_id, self.wrapped_key, self.meta, size,
                      self._sealer.sealed_size)

    def discard(self) -> None:
        self._pending.discard()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.discard()
        return False


class OpenedFile:
    """A sealed file opened for reading: its last chunk already authenticated, so its size is proven."""

    def __init__(self, row: SealedFile, stream, reader: SealedReader, name: str, content_type: str):
        self.row = row
        self.name = name
        self.content_type = content_type
        self._stream = stream
        self._reader = reader
        # Strong, unique per seal, and derived from public bytes only (the header).
        self.etag = '"' + hashlib.sha256(reader.header.pack()).hexdigest()[:32] + '"'

    @property
    def size(self) -> int:
        return self._reader.size

    def iter_range(self, start: int, stop: int):
        """Authenticated plaintext [start, stop) as memoryviews (copy each before the next)."""
        return self._reader.iter_range(start, stop)

    def close(self) -> None:
        self._stream.close()


class Storage:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session] | None = None):
        self.settings = settings
        self.sessions = sessions
        self.vault = Vault(settings)
        ciphers.sealing_algorithm(settings.seal_algorithm)  # refuse an impossible setting at start-up
        self._ring: KeyRing | None = None
        self._tokens: Tokens | None = None

    # --- keys --------------------------------------------------------------------------------

    def keyring(self) -> KeyRing:
        """Loaded once, re-read when a key file changes (one scandir): `storage new-key` needs no restart."""
        if self._ring is None or keys.folder_stamp(self.settings) != self._ring.stamp:
            self._ring = keys.load(self.settings)
            self._tokens = None
        return self._ring

    def tokens(self) -> Tokens:
        ring = self.keyring()
        if self._tokens is None:
            self._tokens = Tokens(ring.signing_keys, max_ttl=self.settings.url_max_ttl)
        return self._tokens

    def data_key(self, row: SealedFile) -> bytes:
        return unwrap_key(self.keyring().master_key(row.key_id), row.key_id, bytes.fromhex(row.id), row.wrapped_key)

    # --- writing -----------------------------------------------------------------------------

    def writer(self, *, filename: str, content_type: str, limit: int | None = None) -> SealingWriter:
        return SealingWriter(self, filename=filename, content_type=content_type, limit=limit)

    def seal(self, stream, *, filename: str, content_type: str, limit: int | None = None) -> Sealed:
        with self.writer(filename=filename, content_type=content_type, limit=limit) as writer:
            writer.fill_from(stream)
            return writer.finish()

    def add(self, session: AnySession, sealed: Sealed, *, owner: str, client: audit.Client = audit.CLI,
            actor: str | None = None) -> str:
        """Record a sealed file in the caller's session (not committed here); returns its id.

        `actor` names who uploaded it (an operator, "upload-token") for the audit entry.
        """
        owner_text(owner)
        session.add(SealedFile(id=sealed.file_id, owner=owner, algorithm=sealed.algorithm, key_id=sealed.key_id,
                               wrapped_key=sealed.wrapped_key, meta=sealed.meta, size=sealed.size,
                               sealed_size=sealed.sealed_size, created_at=clock.utcnow()))
        audit.record(session, "put", "ok", file_id=sealed.file_id, subject=owner, bytes_sent=sealed.size,
                     client=client, detail=sealed.algorithm + (f" by {actor}" if actor else ""))
        log.info("storage: sealed file %s (%d bytes, %s, key %s)", sealed.file_id, sealed.size, sealed.algorithm,
                 sealed.key_id)
        return sealed.file_id

    def discard(self, sealed: Sealed) -> None:
        """Remove a sealed file whose row will not be committed (sweep would, later)."""
        self.vault.remove(sealed.file_id)

    def put(self, session: AnySession, stream, *, filename: str, content_type: str, owner: str) -> str:
        owner_text(owner)
        sealed = self.seal(stream, filename=filename, content_type=content_type)
        return self.add(session, sealed, owner=owner)

    # --- reading -----------------------------------------------------------------------------

    def names(self, session: AnySession, file_ids: set[str], *, client: audit.Client, actor: str) -> dict[str, str | None]:
        """Original names of these files, unsealed; None for one whose metadata cannot be opened.

        A name can be PHI ("HIV test.pdf"): each one unsealed is audited ("show-name", by `actor`
        from `client`) in the caller's session, so the entries commit with the read that showed them."""
        names: dict[str, str | None] = {}
        for row in session.scalars(select(SealedFile).where(SealedFile.id.in_(file_ids))) if file_ids else ():
            try:
                names[row.id] = self.describe(row)[0]
            except (StorageError, ValueError):
                names[row.id] = None
            audit.record(session, "show-name", "ok" if names[row.id] is not None else "cannot-unseal",
                         file_id=row.id, subject=row.owner, client=client, detail=f"by {actor}")
        return names

    def open_file(self, session: AnySession, file_id: str) -> OpenedFile:
        """Open a sealed file for reading in your own code (e.g. to attach it to a message); close() it after."""
        row = session.get(SealedFile, file_id) if valid_id(file_id) else None
        if row is None:
            raise NotFound(f"no file {file_id}")
        return self.open(row)

    def owner(self, session: AnySession, file_id: str) -> str | None:
        """Whom a sealed file belongs to (the `owner` it was put or uploaded with), None if there is no
        such file: what a route checks before it grants access to someone asking for it."""
        row = session.get(SealedFile, file_id) if valid_id(file_id) else None
        return row.owner if row is not None else None

    def describe(self, row: SealedFile) -> tuple[str, str]:
        """(original file name, content type), unsealed."""
        return open_meta(self.data_key(row), bytes.fromhex(row.id), row.meta)

    def open(self, row: SealedFile) -> OpenedFile:
        """Unwrap, check the header against the row, authenticate the last chunk. IntegrityError otherwise."""
        data_key = self.data_key(row)
        binary_id = bytes.fromhex(row.id)
        name, content_type = open_meta(data_key, binary_id, row.meta)
        stream = self.vault.open(row.id)
        try:
            reader = SealedReader(stream, file_id=binary_id, data_key=data_key)
            if reader.size != row.size:
                raise IntegrityError("the sealed file's length does not match its record")
            reader.authenticate_end()
        except BaseException:
            stream.close()
            raise
        return OpenedFile(row, stream, reader, name, content_type)

    def verify(self, row: SealedFile) -> str | None:
        """Authenticate every chunk of one file; the error, or None when it is intact."""
        try:
            opened = self.open(row)
            try:
                for _part in opened.iter_range(0, opened.size):
                    pass
            finally:
                opened.close()
        except (IntegrityError, keys.UnknownKey) as exc:
            return str(exc)
        return None

    def report_integrity(self, file_id: str, error: str | None) -> None:
        """Record the outcome of a check on the file's row (its own transaction), and log a failure."""
        if error is not None:
            log.error("storage: integrity error in file %s: %s", file_id, error)

        def work(session: AnySession) -> None:
            row = session.get(SealedFile, file_id)
            if row is not None:
                row.integrity_error = None if error is None else error[:255]
                row.checked_at = clock.utcnow()
                audit.record(session, "verify", "ok" if error is None else "integrity", file_id=file_id,
                             detail=error)

        in_transaction(self._sessions(), work)

    # --- grants and links --------------------------------------------------------------------

    def grant(self, session: AnySession, file_id: str, subject: str, *, expires_in: float = 3600,
              max_uses: int | None = None) -> str:
        _text(subject, "the subject", NAME_MAX)
        if not 1 <= expires_in <= grants.MAX_EXPIRES_IN:
            raise StorageError(f"expires_in must be 1 second to {grants.MAX_EXPIRES_IN // 86400} days")
        if max_uses is not None and (isinstance(max_uses, bool) or not isinstance(max_uses, int) or max_uses < 1):
            raise StorageError("max_uses must be a positive integer or None")
        if not valid_id(file_id) or session.get(SealedFile, file_id) is None:
            raise NotFound(f"no file {file_id}")
        now = clock.utcnow()
        grant = Grant(id=grants.new_id(), file_id=file_id, subject=subject, created_at=now,
                      expires_at=now + timedelta(seconds=expires_in), max_uses=max_uses, uses=0)
        session.add(grant)
        audit.record(session, "grant", "ok", file_id=file_id, grant_id=grant.id, subject=subject,
                     detail=f"expires_in={int(expires_in)}s max_uses={max_uses}")
        return grant.id

    def revoke(self, session: AnySession, grant_id: str, *, client: audit.Client = audit.CLI,
               actor: str | None = None) -> bool:
        """Revoke a grant; False if it was already revoked. Links already issued stop working at once.
        `actor` names who revoked it (the console's operator) for the audit entry."""
        grant = session.get(Grant, grant_id) if valid_id(grant_id) else None
        if grant is None:
            raise NotFound(f"no grant {grant_id}")
        if grant.revoked_at is not None:
            return False
        grant.revoked_at = clock.utcnow()
        audit.record(session, "revoke", "ok", file_id=grant.file_id, grant_id=grant.id, subject=grant.subject,
                     client=client, detail=f"by {actor}" if actor else None)
        return True

    def signed_url(self, grant_id: str, ttl: int = 300, *, session: Session | None = None,
                   client: audit.Client = audit.CLI, absolute: bool = False) -> str:
        """A `/files/<token>` link for a usable grant, valid `ttl` seconds; audited as issued.

        `absolute=True` puts CRONBOX_BASE_URL in front (for an e-mail or SMS), never the request's
        Host header: whoever sends a request chooses that one, and a link to their host would hand
        them the token. Refused before anything is issued when the setting is missing.
        """
        if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= self.settings.url_max_ttl:
            raise StorageError(f"ttl must be 1 to {self.settings.url_max_ttl} seconds (CRONBOX_URL_MAX_TTL)")
        prefix = ""
        if absolute:
            if self.settings.base_url is None:
                raise BaseUrlMissing()
            prefix = self.settings.base_url

        def work(s: Session) -> str:
            grant = s.get(Grant, grant_id) if valid_id(grant_id) else None
            if grant is None:
                raise NotFound(f"no grant {grant_id}")
            reason = grants.refusal(grant, clock.utcnow())
            if reason is not None:
                raise GrantInvalid(f"grant {grant_id} cannot be used: {reason}")
            token, claims = self.tokens().issue(grant_id, ttl)
            audit.record(s, "issue", "ok", file_id=grant.file_id, grant_id=grant_id, subject=grant.subject,
                         jti=claims.jti, client=client, detail=f"ttl={ttl}s")
            return f"{prefix}{self.settings.files_prefix}/files/{token}"

        return work(session) if session is not None else in_transaction(self._sessions(), work)

    def _sessions(self) -> sessionmaker[Session]:
        if self.sessions is None:
            raise StorageError("this Storage has no database sessions: build it with Storage(settings, sessions)")
        return self.sessions
