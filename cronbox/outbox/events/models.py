"""Tables of the event outbox: events, and one delivery row per (event, consumer)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from cronbox.outbox.core.models import Base, ExactString, Id, LongText, UtcDateTime
from cronbox.outbox.core.text import NAME_MAX

# Statuses of a delivery. `pending` covers new, retrying and leased (claim_token set).
PENDING, DONE, DEAD, SKIPPED = "pending", "done", "dead", "skipped"
# Statuses that hold back later deliveries of the same key for the same consumer.
HOLDING = (PENDING, DEAD)


class OutboxEvent(Base):
    """One recorded event: inserted by `record()` in the caller's transaction, fanned out by the relay
    (`fanned_out_at`) into one delivery per consumer, deleted by `outbox prune` once delivered."""

    __tablename__ = "cronbox_events"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    type: Mapped[str] = mapped_column(ExactString(NAME_MAX))
    key: Mapped[str | None] = mapped_column(ExactString(NAME_MAX))
    payload: Mapped[str] = mapped_column(LongText)
    # The payload's size in UTF-8 bytes, written with it (outbox.core.payload.payload_bytes): the claim
    # bounds a batch by it without reading a payload (outbox.engine.claim). NULL: written by a cronbox
    # older than migration 0013 (unknown, counted as nothing).
    payload_bytes: Mapped[int | None] = mapped_column(Integer)
    trace_id: Mapped[str] = mapped_column(String(32))
    # A sealed payload's row identity (outbox.core.sealing): 32 random hex digits written with the
    # envelope in the same INSERT, bound into its associated data. NULL: a plaintext payload.
    seal_id: Mapped[str | None] = mapped_column(String(32), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # When deliveries may first be attempted (record(..., delay=)).
    available_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # Set once the relay has made this event's delivery rows. No "last id seen"
    # cursor anywhere: an event committed late (a gap) is still NULL here and is
    # picked up by the next pass.
    fanned_out_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "fanned_out_at", "id"),)


class Delivery(Base):
    """One event for one consumer (or forward target): its own attempts, lease (`claim_token`,
    `lease_until`), next attempt, last error and status (pending, done, dead, skipped). The CLI's and
    the console's delivery ids are these rows' ids."""

    __tablename__ = "cronbox_deliveries"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    event_id: Mapped[int] = mapped_column(Id, ForeignKey("cronbox_events.id"))
    consumer: Mapped[str] = mapped_column(ExactString(NAME_MAX))
    # Copied from the event so the ordering check needs no join.
    key: Mapped[str | None] = mapped_column(ExactString(NAME_MAX))
    # Copied from the event at fan-out, so the claim's candidate query bounds a batch by payload
    # bytes without a join (outbox.engine.claim). NULL: unknown (a row older than migration 0013).
    payload_bytes: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime)
    claim_token: Mapped[str | None] = mapped_column(ExactString(32))
    lease_until: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_error: Mapped[str | None] = mapped_column(String(1000))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (
        UniqueConstraint("event_id", "consumer"),
        # The claim scans: due pending rows in id order; leases that expired.
        Index(None, "status", "next_attempt_at", "id"),
        Index(None, "status", "lease_until"),
        # The per-key ordering check: an earlier holding delivery of this key?
        Index(None, "consumer", "key", "status", "event_id"),
        # Counts per consumer and status (health check, console) from the index alone.
        Index(None, "status", "consumer", "next_attempt_at"),
    )


class InboxEntry(Base):
    """A message a broker consumer has handled (outbox.events.inbox): written in the consumer's own
    transaction, so a redelivered or republished message finds it and is not handled again."""

    __tablename__ = "cronbox_inbox"

    consumer: Mapped[str] = mapped_column(ExactString(NAME_MAX), primary_key=True)
    message_id: Mapped[str] = mapped_column(ExactString(NAME_MAX), primary_key=True)
    event_type: Mapped[str] = mapped_column(String(NAME_MAX))
    trace_id: Mapped[str | None] = mapped_column(String(64))
    received_at: Mapped[datetime] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "received_at"),)


class Redelivery(Base):
    """How many times `amqp consume --ordered` got a message back unacked (outbox.events.redeliveries):
    in that mode a message cannot be moved to carry the count in its headers, so it is kept here."""

    __tablename__ = "cronbox_redeliveries"

    queue: Mapped[str] = mapped_column(ExactString(NAME_MAX), primary_key=True)
    message_id: Mapped[str] = mapped_column(ExactString(NAME_MAX), primary_key=True)
    times: Mapped[int] = mapped_column(Integer)
    seen_at: Mapped[datetime] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "seen_at"),)
