"""The append-only audit trail of sealed files (table cronbox_file_audit).

Who did what to which file, when, from where, and how it ended. Entries are
added to the caller's session, so an audited action and its entry commit
together (a refused download is audited in its own short transaction). The
token itself is never stored: at most a hash of its random id (jti), enough
to tie the entries of one link together.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from cronbox.outbox.core import clock, paging
from cronbox.outbox.core.session_types import AnySession
from cronbox.outbox.core.text import NAME_MAX

from .models import AuditEntry, Grant


@dataclass(frozen=True)
class Client:
    """Where a request came from (client IP as resolved per CRONBOX_TRUSTED_PROXIES)."""

    ip: str | None = None
    user_agent: str | None = None


CLI = Client(ip=None, user_agent="cron cli")


def jti_hash(jti: str) -> str:
    return hashlib.sha256(jti.encode("ascii", "replace")).hexdigest()[:32]


def _cut(text: str | None, length: int) -> str | None:
    return None if text is None else text[:length]


def record(session: AnySession, action: str, outcome: str, *, status: int | None = None, file_id: str | None = None,
           grant_id: str | None = None, subject: str | None = None, jti: str | None = None,
           byte_range: tuple[int, int] | None = None, bytes_sent: int | None = None, client: Client | None = None,
           detail: str | None = None) -> AuditEntry:
    """Add one entry to `session`. An entry naming a grant that still exists always names its file and
    subject too, looked up here when the caller did not know them (a refused or expired link): the
    console's filters and `storage audit --file` find it, and it stays tied to the file after
    `storage sweep` deletes the ended grant."""
    if grant_id and (file_id is None or subject is None):
        grant = session.get(Grant, grant_id)
        if grant is not None:
            file_id = file_id if file_id is not None else grant.file_id
            subject = subject if subject is not None else grant.subject
    entry = AuditEntry(
        at=clock.utcnow(), action=action, outcome=outcome[:32], status=status, file_id=file_id, grant_id=grant_id,
        subject=_cut(subject, NAME_MAX), jti_hash=jti_hash(jti) if jti else None,
        range_start=byte_range[0] if byte_range else None, range_end=byte_range[1] if byte_range else None,
        bytes_sent=bytes_sent, client_ip=_cut(client.ip, 45) if client else None,
        user_agent=_cut(client.user_agent, 255) if client else None, detail=_cut(detail, 255),
    )
    session.add(entry)
    return entry


def page(session: Session, cursor: tuple | None = None, *, file_id: str | None = None, subject: str | None = None,
         outcome: str | None = None, size: int = paging.PAGE_SIZE) -> paging.Page:
    """Entries newest first (cursor: the id), for `storage audit` and the console; each filter has its
    (filter, id) index, so a page deep in 100k entries is still a range read."""
    A = AuditEntry.__table__
    rows = select(A.c.id, A.c.at, A.c.action, A.c.outcome, A.c.status, A.c.file_id, A.c.grant_id, A.c.subject,
                  A.c.range_start, A.c.range_end, A.c.bytes_sent, A.c.client_ip, A.c.detail)
    if file_id is not None:
        rows = rows.where(A.c.file_id == file_id)
    if subject is not None:
        rows = rows.where(A.c.subject == subject)
    if outcome is not None:
        rows = rows.where(A.c.outcome == outcome)
    return paging.page(session, rows, (A.c.id,), cursor, size=size)


def prune(session: Session, cutoff: datetime, batch: int) -> int:
    """Delete up to `batch` entries older than `cutoff`, oldest first (ids first: MySQL refuses LIMIT in IN)."""
    ids = list(session.scalars(select(AuditEntry.id).where(AuditEntry.at < cutoff).order_by(AuditEntry.id)
                               .limit(batch)))
    if ids:
        session.execute(delete(AuditEntry).where(AuditEntry.id.in_(ids)))
    return len(ids)
