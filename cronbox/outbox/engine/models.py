"""The record every cron-started run leaves (one heartbeat row per run), and the handler profiles runs keep."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from cronbox.outbox.core.models import Base, ExactString, Id, LongText, UtcDateTime
from cronbox.outbox.core.text import NAME_MAX


class Heartbeat(Base):
    """One row per run of tick / outbox publish / queue work: what it did and how it ended."""

    __tablename__ = "cronbox_heartbeats"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    command: Mapped[str] = mapped_column(ExactString(32))
    host: Mapped[str] = mapped_column(ExactString(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    outcome: Mapped[str] = mapped_column(String(32), default="running")
    delivered: Mapped[int] = mapped_column(Integer, default=0)
    retried: Mapped[int] = mapped_column(Integer, default=0)
    dead: Mapped[int] = mapped_column(Integer, default=0)
    jobs_done: Mapped[int] = mapped_column(Integer, default=0)
    jobs_failed: Mapped[int] = mapped_column(Integer, default=0)
    backlog: Mapped[int | None] = mapped_column(Integer)
    peak_rss_kb: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(1000))
    # Long-running runs (amqp consume) beat every few seconds: a "running" row whose beat is old
    # is a process that died without finishing its row (health says so). NULL: a cron run.
    beat_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    detail: Mapped[str | None] = mapped_column(ExactString(NAME_MAX))  # what the run serves, e.g. the queue

    __table_args__ = (Index(None, "started_at"),)


class HandlerProfile(Base):
    """A recent profile of one handler (kind "job" or "delivery"): how long it ran and how much the
    worker's RSS grew while it did, over a window of recent runs, for admission (outbox.engine.admission)."""

    __tablename__ = "cronbox_handler_profiles"

    kind: Mapped[str] = mapped_column(ExactString(16), primary_key=True)
    handler: Mapped[str] = mapped_column(ExactString(NAME_MAX), primary_key=True)
    runs: Mapped[int] = mapped_column(Integer)
    duration_ms: Mapped[int] = mapped_column(Integer)
    rss_growth_kb: Mapped[int] = mapped_column(Integer)
    samples: Mapped[str] = mapped_column(LongText)  # JSON: the recent runs the summary is made of
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    never_fits: Mapped[str | None] = mapped_column(String(255))  # why no run could admit it, if so
    never_fits_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
