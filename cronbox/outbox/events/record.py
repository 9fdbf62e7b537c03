"""record(): the write side of the transactional outbox."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Table, insert

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.core.inserts import check_text, connection_of, delay_seconds, new_trace_id
from cronbox.outbox.core.payload import dump_payload, payload_bytes
from cronbox.outbox.core.sealing import EVENTS, seal_for_insert
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.engine.registry import DEFAULT
from cronbox.outbox.events.models import OutboxEvent
from cronbox.outbox.core.session_types import Transactional

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
           delay: float | timedelta = 0, sealed: bool | None = None) -> RecordedEvent:
    """Insert an event in the caller's transaction: it commits with the business rows or not at all.

    `session` is the caller's Session (or scoped session) or a Core Connection inside a
    transaction; the INSERT runs on that transaction's connection at once, so the returned event
    has its id. Never commits, and never flushes the caller's pending objects. `key` orders
    events: a consumer gets events of one key one at a time, in the order they were recorded
    (writers of one key must serialise, e.g. by locking the aggregate row, since ids are given at
    INSERT). `delay` postpones the first attempt.

    `type` names the event (what consumers register for); `payload` is a JSON value (str, int, float,
    bool, None, list, dict), stored as given. Returns the recorded event (its `id` set).

    sealed=True stores the payload as an AES-256-GCM envelope under the app's key vault (one AEAD
    call; docs/sealed-format.md "Sealed payloads"), opened only in the worker's memory. A type some
    `@consumer(..., sealed=True)` declares is sealed whatever the producer says: sealed=False for it
    is refused (a producer cannot unseal a type), and so is every type under
    CRONBOX_SEAL_PAYLOADS=all. The returned event's `payload` is then the envelope.

    Raises `cronbox.outbox.core.errors.PayloadError` (a `CronboxError` and a `TypeError`) for a
    payload that is not plain JSON, naming the offending key, a type or key that is empty, too long
    or holds a NUL, or a delay that is not a number of seconds from 0 to a century; nothing is written
    then (dispatch() refuses the same faults with the same words: outbox.core.inserts).
    """
    check_text(type, "event type", limit=NAME_MAX)
    check_text(key, "event key", limit=NAME_MAX, optional=True)
    seconds = delay_seconds(delay)
    declared = type in DEFAULT.sealed_types
    if sealed is False and declared:
        raise PayloadError(f"event type {type!r} is declared sealed (@consumer(..., sealed=True)): "
                           "record(..., sealed=False) cannot unseal it")
    body = dump_payload(payload)
    now = clock.utcnow()
    trace_id, available_at = new_trace_id(), now + timedelta(seconds=seconds) if seconds else now
    connection = connection_of(session, OutboxEvent)
    body, seal_id = seal_for_insert(connection, EVENTS, type, body, sealed=bool(sealed or declared),
                                    what=f"event type {type!r}")
    row = {"type": type, "key": key, "payload": body, "payload_bytes": payload_bytes(body), "trace_id": trace_id,
           "created_at": now, "available_at": available_at, "seal_id": seal_id}
    event_id = connection.execute(_INSERT, row).inserted_primary_key[0]  # type: ignore[index]
    return RecordedEvent(event_id, type, key, body, trace_id, now, available_at)
