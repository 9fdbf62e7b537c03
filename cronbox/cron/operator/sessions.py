"""Operator sessions, stored server-side (table cronbox_ops_sessions).

The browser holds a random id inside Flask's signed session cookie; the table
holds only its SHA-256, with an idle limit and an absolute end. Checking the
row on every request is what makes logout and "password changed" end a
session everywhere at once. `seen_at` is written at most once a minute, so
browsing does not turn every page view into a write.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from cronbox.cron.operator.models import OPS_SESSION_ABSOLUTE as ABSOLUTE
from cronbox.cron.operator.models import OPS_SESSION_IDLE as IDLE
from cronbox.cron.operator.models import OperatorSession

TOUCH_EVERY = timedelta(minutes=1)


def _hash(raw_id: str) -> str:
    return hashlib.sha256(raw_id.encode("utf-8", "replace")).hexdigest()


@dataclass(frozen=True)
class Current:
    id_hash: str
    created_at: datetime


def start(session: Session, now: datetime, *, fingerprint: str, client_ip: str | None,
          user_agent: str | None) -> str:
    """A new session row; returns the raw id for the cookie (never stored)."""
    raw = secrets.token_urlsafe(32)
    session.add(OperatorSession(id_hash=_hash(raw), created_at=now, seen_at=now, expires_at=now + ABSOLUTE,
                                password_fingerprint=fingerprint, client_ip=client_ip and client_ip[:45],
                                user_agent=user_agent and user_agent[:255]))
    return raw


def check(session: Session, raw_id: str | None, now: datetime, fingerprint: str | None) -> Current | None:
    """The live session for this cookie id, or None (unknown, idle too long, past its end, or logged in
    under another password than the one in force now)."""
    if not raw_id or not isinstance(raw_id, str) or len(raw_id) > 128 or fingerprint is None:
        return None
    row = session.get(OperatorSession, _hash(raw_id))
    if row is None or row.expires_at <= now or row.seen_at <= now - IDLE:
        return None
    if not hmac.compare_digest(row.password_fingerprint, fingerprint):
        return None
    if row.seen_at <= now - TOUCH_EVERY:
        session.execute(update(OperatorSession).where(OperatorSession.id_hash == row.id_hash).values(seen_at=now))
    return Current(row.id_hash, row.created_at)


def end(session: Session, raw_id: str | None) -> None:
    if raw_id and isinstance(raw_id, str):
        session.execute(delete(OperatorSession).where(OperatorSession.id_hash == _hash(raw_id)))


def end_all(session: Session) -> int:
    return session.execute(delete(OperatorSession)).rowcount
