"""Tables of the scheduling parts: scheduler slots, one-off runs, alert state."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from cronbox.outbox.core.models import Base, ExactString, Id, LongText, UtcDateTime
from cronbox.outbox.core.text import NAME_MAX


class ScheduleRun(Base):
    """One row per (task, slot): the unique key is what makes a slot run at most once,
    even with overlapping ticks or several servers sharing the database."""

    __tablename__ = "cronbox_schedule_runs"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    task: Mapped[str] = mapped_column(ExactString(NAME_MAX))
    slot: Mapped[datetime] = mapped_column(UtcDateTime)
    status: Mapped[str] = mapped_column(String(16))  # running, ok, error
    started_at: Mapped[datetime] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    error: Mapped[str | None] = mapped_column(String(1000))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)

    __table_args__ = (UniqueConstraint("task", "slot"), Index(None, "started_at"))


class OnceRequest(Base):
    """A one-off command asked for without SSH (a *.cmd file, `once add`, the console)."""

    __tablename__ = "cronbox_once_requests"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    argv: Mapped[str] = mapped_column(Text)  # JSON list of arguments, never a shell string
    source: Mapped[str] = mapped_column(String(255))  # file:<name>, cli, console:<operator>
    status: Mapped[str] = mapped_column(String(16))  # pending, running, done, failed, refused
    reason: Mapped[str | None] = mapped_column(String(500))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    output: Mapped[str | None] = mapped_column(LongText)
    requested_at: Mapped[datetime] = mapped_column(UtcDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "status", "id"), Index(None, "requested_at"))


class AlertState(Base):
    """Per problem: is it failing, and when was the operator last told (alerts at most hourly)."""

    __tablename__ = "cronbox_alert_states"

    problem: Mapped[str] = mapped_column(ExactString(NAME_MAX), primary_key=True)
    failing: Mapped[bool] = mapped_column(Boolean)
    detail: Mapped[str | None] = mapped_column(String(500))
    since: Mapped[datetime] = mapped_column(UtcDateTime)
    last_alerted_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
