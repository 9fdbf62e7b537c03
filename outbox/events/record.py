"""record(): the write side of the transactional outbox."""
from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy.orm import Session

from outbox.core import clock
from outbox.core.errors import PayloadError
from outbox.core.payload import dump_payload
from outbox.events.models import OutboxEvent

MAX_TEXT = 191


def new_trace_id() -> str:
    return uuid.uuid4().hex[:16]


def record(session: Session, type: str, payload, *, key: str | None = None, delay: float | timedelta = 0) -> OutboxEvent:
    """Add an event to the caller's session: it commits with the business rows or not at all.

    Never commits or flushes on the caller's behalf. `key` orders events: a
    consumer gets events of one key one at a time, in the order they were
    recorded (writers of one key must serialise, e.g. by locking the aggregate
    row, since ids are given at INSERT). `delay` postpones the first attempt.
    """
    if not isinstance(type, str) or not type or len(type) > MAX_TEXT:
        raise PayloadError(f"event type must be a non-empty string of at most {MAX_TEXT} characters")
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_TEXT):
        raise PayloadError(f"event key must be None or a non-empty string of at most {MAX_TEXT} characters")
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise PayloadError(f"delay must be a number of seconds >= 0, not {delay!r}")
    body = dump_payload(payload)
    now = clock.utcnow()
    event = OutboxEvent(
        type=type,
        key=key,
        payload=body,
        trace_id=new_trace_id(),
        created_at=now,
        available_at=now + timedelta(seconds=seconds),
    )
    session.add(event)
    return event
