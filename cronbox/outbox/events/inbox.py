"""The inbox: which broker messages each consumer has already handled.

A consumer run off a broker (`python -m cronbox amqp consume`) gets every message at least once: the
broker redelivers what was not acked, and the relay republishes what it could not see confirmed.
`take_first()` writes the (consumer, message_id) row in the consumer's own transaction, before the
handler runs: committed with the handler's writes, or rolled back with them. A second copy of the
message finds the row and is acked without running the handler again, so the consumer's DB effects
happen once. The broker ack goes out only after that commit.

Isolation: the row's primary key does the work. Two processes handling two copies at once both
INSERT the same key; the second waits on the first's row lock (InnoDB, any isolation level; SQLite
serialises writers under BEGIN IMMEDIATE) and then either fails with a duplicate key (the first
committed: skip) or goes on (the first rolled back: handle it). No SELECT-then-INSERT race.

Rows are kept for CRONBOX_INBOX_RETENTION_DAYS (retention prunes them, oldest first); a copy
arriving after that window would run again.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from cronbox.outbox.core.sql import delete_oldest
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.events.models import InboxEntry

T = InboxEntry.__table__


def take_first(connection: Connection, consumer: str, message_id: str, event_type: str, trace_id: str | None,
               now: datetime) -> bool:
    """Record that `consumer` handles `message_id`, as the first statement of a transaction on
    `connection` (the broker consumer's attempt, before the handler's session joins it). False if it
    already has (a committed row): the caller rolls the transaction back, skips the handler and acks.
    No savepoint: a duplicate ends that transaction anyway."""
    try:
        connection.execute(_INSERT, _row(consumer, message_id, event_type, trace_id, now))
    except IntegrityError:
        return False
    return True


_INSERT = insert(T)  # built once, values as parameters: one cached compiled statement


def _row(consumer: str, message_id: str, event_type: str, trace_id: str | None, now: datetime) -> dict:
    return {"consumer": consumer, "message_id": message_id, "event_type": event_type[:NAME_MAX],
            "trace_id": (trace_id or None) and trace_id[:64], "received_at": now}


def prune(session: Session, cutoff: datetime, batch: int) -> int:
    """Delete up to `batch` rows received before `cutoff`, oldest first (the received_at index)."""
    return delete_oldest(session, T, [T.c.consumer, T.c.message_id], T.c.received_at, cutoff, batch)
