"""Grants (who may download which file, until when, how many times) and counting their uses.

A use is counted per token id (jti) and client, not per request and not per token text:
a download manager's range requests, a resumed download or a malleable variant
of the same token are one use as long as they come from the same client within
SAME_USE_WINDOW of the first request of that use (`first_at`). The client is
its address (as CRONBOX_TRUSTED_PROXIES resolves it; IPv6 per /64, the block one
subscriber gets) and its User-Agent, both folded into the use's key
(`use_key_for`): the same link replayed from another address or browser inside the
window is a use of its own, refused when none is left, so a `max_uses=1` link
gives one client one download. The window is bounded from the
first request, not slid from the previous one: otherwise a client repeating a
request every 100 s would keep a `max_uses=1` link working for its whole life. Counting is two guarded statements in one
short transaction, safe on every backend without SKIP LOCKED:

1. INSERT the (grant, jti) use row, ignoring a duplicate key. On MySQL/MariaDB
   `INSERT IGNORE` waits on a concurrent uncommitted insert of the same key, so
   two simultaneous first requests of one jti cannot both count; SQLite
   serialises writers (BEGIN IMMEDIATE) anyway.
2. Only for a new use: `UPDATE grants SET uses = uses + 1 WHERE id = ? AND not
   revoked AND not expired AND uses < max_uses`. A rowcount of 0 means the
   grant was used up or revoked meanwhile; the caller rolls back, so the use
   row goes too. No read-then-write race: the guard is in the UPDATE.
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from cronbox.outbox.core import paging
from cronbox.outbox.core.sql import insert_ignore
from cronbox.outbox.queue.ratelimit import client_key

from .errors import GrantInvalid
from .models import Grant, GrantUse, SealedFile

SAME_USE_WINDOW = 120  # seconds from the first request of a use of one jti
MAX_EXPIRES_IN = 366 * 86400
GRANT_RETENTION = timedelta(days=30)  # grants (and their use rows) kept after they end, then swept


def new_id() -> str:
    return secrets.token_hex(16)


def use_key_for(jti: str, client_ip: str | None, user_agent: str | None) -> str:
    """The key of a use: the token id and the client it was redeemed by, hashed (GrantUse.jti_hash)."""
    raw = "\0".join((jti, client_key(client_ip), user_agent or ""))
    return hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest()[:32]


def refusal(grant: Grant | None, now: datetime) -> str | None:
    """Why `grant` cannot start a new use now, or None when it can."""
    if grant is None:
        return "unknown-grant"
    if grant.revoked_at is not None:
        return "revoked"
    if grant.expires_at <= now:
        return "grant-expired"
    if grant.max_uses is not None and grant.uses >= grant.max_uses:
        return "exhausted"
    return None


@dataclass(frozen=True)
class Decision:
    grant: Grant
    file: SealedFile


def check(session: Session, grant_id: str, use_key: str, now: datetime) -> Decision:
    """The read-only check before a download; GrantInvalid with the reason when it cannot go ahead.

    A used-up grant still serves a repeat of the token that took its last use, by the same client
    (`use_key_for`) within the window: the second half of an interrupted download is not a new use.
    """
    grant = session.get(Grant, grant_id)
    reason = refusal(grant, now)
    if reason == "exhausted":
        use = session.get(GrantUse, (grant_id, use_key))
        if use is not None and use.first_at >= now - timedelta(seconds=SAME_USE_WINDOW):
            reason = None
    if reason is not None:
        raise GrantInvalid(reason)
    return Decision(grant, session.get(SealedFile, grant.file_id))


def _insert_use(session: Session, grant_id: str, use_key: str, now: datetime) -> bool:
    values = {"grant_id": grant_id, "jti_hash": use_key, "first_at": now, "last_at": now, "requests": 1}
    return insert_ignore(session, GrantUse.__table__, values).rowcount == 1


def _take_use(session: Session, grant_id: str, now: datetime) -> bool:
    result = session.execute(
        update(Grant)
        .where(Grant.id == grant_id, Grant.revoked_at.is_(None), Grant.expires_at > now,
               or_(Grant.max_uses.is_(None), Grant.uses < Grant.max_uses))
        .values(uses=Grant.uses + 1)
        .execution_options(synchronize_session=False))
    return result.rowcount == 1


def _join_use(session: Session, grant_id: str, use_key: str, now: datetime, *, window_start: datetime) -> bool:
    """Count a request into the current use of this key if that use began at or after `window_start`."""
    result = session.execute(
        update(GrantUse)
        .where(GrantUse.grant_id == grant_id, GrantUse.jti_hash == use_key, GrantUse.first_at >= window_start)
        .values(last_at=now, requests=GrantUse.requests + 1)
        .execution_options(synchronize_session=False))
    return result.rowcount == 1


def _restart_use(session: Session, grant_id: str, use_key: str, now: datetime) -> None:
    """The key's previous use is over and a new one was taken: its window starts now."""
    session.execute(update(GrantUse).where(GrantUse.grant_id == grant_id, GrantUse.jti_hash == use_key)
                    .values(first_at=now, last_at=now, requests=GrantUse.requests + 1)
                    .execution_options(synchronize_session=False))


def count_use(session: Session, grant_id: str, use_key: str, now: datetime) -> bool:
    """Record this request; True if it started a new use, False if it joined the current one.

    Raises GrantInvalid (the caller must roll back) when the grant cannot be used.
    """
    if _insert_use(session, grant_id, use_key, now):
        if not _take_use(session, grant_id, now):
            raise GrantInvalid(refusal(session.get(Grant, grant_id, populate_existing=True), now) or "exhausted")
        return True
    window_start = now - timedelta(seconds=SAME_USE_WINDOW)
    if _join_use(session, grant_id, use_key, now, window_start=window_start):
        grant = session.get(Grant, grant_id, populate_existing=True)
        reason = refusal(grant, now)
        if reason is not None and reason != "exhausted":  # revoked or expired since the first request
            raise GrantInvalid(reason)
        return False
    if not _take_use(session, grant_id, now):
        raise GrantInvalid(refusal(session.get(Grant, grant_id, populate_existing=True), now) or "exhausted")
    _restart_use(session, grant_id, use_key, now)
    return True


def prune(session: Session, now: datetime, batch: int) -> int:
    """Delete up to `batch` grants that ended (expired or revoked) over GRANT_RETENTION ago, with their uses."""
    cutoff = now - GRANT_RETENTION
    ids = list(session.scalars(
        select(Grant.id).where(or_(Grant.expires_at < cutoff, Grant.revoked_at < cutoff)).limit(batch)))
    if ids:
        session.execute(delete(GrantUse).where(GrantUse.grant_id.in_(ids)))
        session.execute(delete(Grant).where(Grant.id.in_(ids)))
    return len(ids)


def page(session: Session, cursor: tuple | None = None, *, file_id: str | None = None, subject: str | None = None,
         size: int = 20) -> paging.Page:
    """Grants newest first (cursor: created_at, id), for the console."""
    G = Grant.__table__
    rows = select(G.c.id, G.c.file_id, G.c.subject, G.c.created_at, G.c.expires_at, G.c.max_uses, G.c.uses,
                  G.c.revoked_at)
    if file_id is not None:
        rows = rows.where(G.c.file_id == file_id)
    if subject is not None:
        rows = rows.where(G.c.subject == subject)
    return paging.page(session, rows, (G.c.created_at, G.c.id), cursor, size=size)


PAGE_KEY = (datetime, str)  # the grants page cursor's value types
