"""record(): the write side of the transactional outbox."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Table, insert

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.core.payload import dump_payload, payload_bytes
from cronbox.outbox.core.text import is_utf8
from cronbox.outbox.events.models import OutboxEvent
from cronbox.outbox.core.logs import new_trace_id
from cronbox.outbox.core.session_types import Transactional, connection_of

MAX_TEXT = 191
# Built once; SQLAlchemy compiles it once per dialect and set of columns, and keeps it in the
# engine's compiled cache: each call only binds the row's values.
_INSERT = insert(cast(Table, OutboxEvent.__table__))


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """The row record() inserted, as it will be committed (or rolled back) with the caller's transaction."""

    id: int
    type: str
    key: str | None
    payload: str
    trace_id: str
    created_at: datetime
    available_at: datetime


def record(session: Transactional, type: str, payload, *, key: str | None = None,
           delay: float | timedelta = 0) -> RecordedEvent:
    """Insert an event in the caller's transaction: it commits with the business rows or not at all.

    `session` is the caller's Session (or scoped session) or a Core Connection inside a
    transaction; the INSERT runs on that transaction's connection at once, so the returned event
    has its id. Never commits, and never flushes the caller's pending objects. `key` orders
    events: a consumer gets events of one key one at a time, in the order they were recorded
    (writers of one key must serialise, e.g. by locking the aggregate row, since ids are given at
    INSERT). `delay` postpones the first attempt.

    `type` names the event (what consumers register for); `payload` is a JSON value (str, int, float,
    bool, None, list, dict), stored as given. Returns the recorded event (its `id` set).

    Raises `cronbox.outbox.core.errors.PayloadError` (a `CronboxError` and a `TypeError`) for a
    payload that is not plain JSON, naming the offending key, or a type or key that is empty, too long
    or holds a NUL; nothing is written then.
    """
    if not isinstance(type, str) or not type or len(type) > MAX_TEXT:
        raise PayloadError(f"event type must be a non-empty string of at most {MAX_TEXT} characters")
    if key is not None and (not isinstance(key, str) or not key or len(key) > MAX_TEXT):
        raise PayloadError(f"event key must be None or a non-empty string of at most {MAX_TEXT} characters")
    if "\x00" in type or (key is not None and "\x00" in key):  # PostgreSQL stores no NUL in text: none does
        raise PayloadError("event type and key must not contain NUL characters")
    if not is_utf8(type) or (key is not None and not is_utf8(key)):
        raise PayloadError("event type and key must be UTF-8 text (no lone surrogates)")
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise PayloadError(f"delay must be a number of seconds >= 0, not {delay!r}")
    body = dump_payload(payload)
    now = clock.utcnow()
    trace_id, available_at = new_trace_id(), now + timedelta(seconds=seconds) if seconds else now
    row = {"type": type, "key": key, "payload": body, "payload_bytes": payload_bytes(body), "trace_id": trace_id,
           "created_at": now, "available_at": available_at}
    event_id = connection_of(session, OutboxEvent).execute(_INSERT, row).inserted_primary_key[0]  # type: ignore[index]
    return RecordedEvent(event_id, type, key, body, trace_id, now, available_at)
