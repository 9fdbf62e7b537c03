"""Tables the channels write: in-app notifications and the record of every send attempt."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from cronbox.outbox.core.models import Base, ExactString, Id, UtcDateTime
from cronbox.outbox.core.text import NAME_MAX


class Notification(Base):
    """In-app notifications written by the notification channel (usually inside a job's ctx.session)."""

    __tablename__ = "cronbox_notifications"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    recipient: Mapped[str] = mapped_column(ExactString(NAME_MAX))
    kind: Mapped[str] = mapped_column(String(64))
    title: Mapped[str] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(Text)
    data: Mapped[str | None] = mapped_column(Text)
    # The job's idempotency key: a re-run of the same job cannot notify twice.
    dedupe_key: Mapped[str | None] = mapped_column(ExactString(NAME_MAX), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    read_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "recipient", "read_at", "id"), Index(None, "created_at"))


class SendAttempt(Base):
    """Every attempt of a channel to send something: what the provider answered, never the content."""

    __tablename__ = "cronbox_send_attempts"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    channel: Mapped[str] = mapped_column(ExactString(32))
    idempotency_key: Mapped[str] = mapped_column(ExactString(NAME_MAX))
    recipient_masked: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(32))  # sent, rejected, retry, paused, unknown, found
    http_status: Mapped[int | None] = mapped_column(Integer)
    provider_status: Mapped[str | None] = mapped_column(String(64))
    provider_id: Mapped[str | None] = mapped_column(String(NAME_MAX))
    detail: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "idempotency_key"), Index(None, "created_at"))
