"""The kill count of messages `amqp consume --ordered` holds in place.

Without --ordered, a message the broker gives back unacked (the process died with it in hand) is
republished to the back of the queue carrying its count in `x-cronbox-redeliveries`
(outbox.events.consume). With --ordered it cannot move (that would let later messages of its key
overtake it), so the count lives here instead, one row per (queue, message_id): raised in its own
committed transaction before any consumer runs the redelivered message, read back in the same
transaction, and deleted once the message is finished (acked or parked). A message whose count
reaches --max-redeliveries is parked in Q.dead instead of killing every consumer it reaches.

Only redelivered messages touch this table: a message delivered once costs nothing here.

Isolation: the (queue, message_id) primary key. INSERT IGNORE makes the row if it is missing, the
UPDATE then locks it and raises the count (InnoDB: the row lock is held to the COMMIT; SQLite:
BEGIN IMMEDIATE serialises writers), so two processes counting the same message at once (only
possible when single-active-consumer hands the queue over mid-message) both count, in turn.
Rows a crash left behind are pruned with the inbox's window (CRONBOX_INBOX_RETENTION_DAYS).
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from cronbox.outbox.core.sql import delete_oldest, insert_ignore
from cronbox.outbox.events.models import Redelivery

T = Redelivery.__table__


def count(session: Session, queue: str, message_id: str, now: datetime) -> int:
    """One more redelivery of the message, in the caller's transaction; returns how many so far."""
    insert_ignore(session, T, {"queue": queue, "message_id": message_id, "times": 0, "seen_at": now})
    session.execute(update(T).where(T.c.queue == queue, T.c.message_id == message_id)
                    .values(times=T.c.times + 1, seen_at=now))
    return session.scalar(select(T.c.times).where(T.c.queue == queue, T.c.message_id == message_id))


def forget(session: Session, queue: str, message_id: str) -> None:
    """The message is finished (acked or parked): its count is no longer needed."""
    session.execute(delete(T).where(T.c.queue == queue, T.c.message_id == message_id))


def prune(session: Session, cutoff: datetime, batch: int) -> int:
    """Delete up to `batch` rows last seen before `cutoff`, oldest first (the seen_at index)."""
    return delete_oldest(session, T, [T.c.queue, T.c.message_id], T.c.seen_at, cutoff, batch)
