"""Tables of the outbox: events, their per-consumer deliveries, run heartbeats.

Every table is prefixed `cronbox_` because the host app shares the database.
Times are naive UTC (see clock.py). Schema changes go through migrations/ only;
tests/test_migrations.py checks that these models and the migrations agree.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import BigInteger, Boolean, DateTime, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Microsecond precision on MySQL (plain DATETIME truncates to seconds, which would
# make "oldest due age" and latency numbers meaningless).
UtcDateTime = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
# BIGINT ids on MySQL; SQLite only auto-increments a column declared INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")

# Statuses of a delivery. `pending` covers new, retrying and leased (claim_token set).
PENDING, DONE, DEAD, SKIPPED = "pending", "done", "dead", "skipped"
# Statuses that hold back later deliveries of the same key for the same consumer.
HOLDING = (PENDING, DEAD)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class OutboxEvent(Base):
    __tablename__ = "cronbox_events"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    type: Mapped[str] = mapped_column(String(191))
    key: Mapped[str | None] = mapped_column(String(191))
    payload: Mapped[str] = mapped_column(LongText)
    trace_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # When deliveries may first be attempted (record(..., delay=)).
    available_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # Set once the relay has made this event's delivery rows. No "last id seen"
    # cursor anywhere: an event committed late (a gap) is still NULL here and is
    # picked up by the next pass.
    fanned_out_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "fanned_out_at", "id"),)


class Delivery(Base):
    __tablename__ = "cronbox_deliveries"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    event_id: Mapped[int] = mapped_column(Id, ForeignKey("cronbox_events.id"))
    consumer: Mapped[str] = mapped_column(String(191))
    # Copied from the event so the ordering check needs no join.
    key: Mapped[str | None] = mapped_column(String(191))
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime)
    claim_token: Mapped[str | None] = mapped_column(String(32))
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


class Heartbeat(Base):
    """One row per run of tick / outbox publish / queue work: what it did and how it ended."""

    __tablename__ = "cronbox_heartbeats"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    command: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(255))
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

    __table_args__ = (Index(None, "started_at"),)


# ---- the job queue -------------------------------------------------------------------

# Job statuses. `available_at` is when a job may be claimed: its due time while
# ready, its lease expiry while reserved, NULL once finished. Claims read one
# index range: (queue, status, available_at <= now).
READY, RESERVED, JOB_DONE, FAILED = "ready", "reserved", "done", "failed"


class Job(Base):
    __tablename__ = "cronbox_jobs"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    queue: Mapped[str] = mapped_column(String(64))
    handler: Mapped[str] = mapped_column(String(191))
    payload: Mapped[str] = mapped_column(LongText)
    status: Mapped[str] = mapped_column(String(16), default=READY)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    available_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    claim_token: Mapped[str | None] = mapped_column(String(32))
    # Set while the job is waiting or running; cleared when it finishes or fails for
    # good, which frees the key for the next dispatch (NULLs never collide).
    unique_key: Mapped[str | None] = mapped_column(String(191), unique=True)
    retry_until: Mapped[datetime | None] = mapped_column(UtcDateTime)
    trace_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    reserved_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_error: Mapped[str | None] = mapped_column(String(1000))
    error_class: Mapped[str | None] = mapped_column(String(191))
    traceback: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index(None, "queue", "status", "available_at", "id"),
        Index(None, "status", "finished_at"),
    )


class Notification(Base):
    """In-app notifications written by the notification channel (usually inside a job's ctx.session)."""

    __tablename__ = "cronbox_notifications"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    recipient: Mapped[str] = mapped_column(String(191))
    kind: Mapped[str] = mapped_column(String(64))
    title: Mapped[str] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(Text)
    data: Mapped[str | None] = mapped_column(Text)
    # The job's idempotency key: a re-run of the same job cannot notify twice.
    dedupe_key: Mapped[str | None] = mapped_column(String(191), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    read_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "recipient", "read_at", "id"), Index(None, "created_at"))


class SendAttempt(Base):
    """Every attempt of a channel to send something: what the provider answered, never the content."""

    __tablename__ = "cronbox_send_attempts"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    channel: Mapped[str] = mapped_column(String(32))
    idempotency_key: Mapped[str] = mapped_column(String(191))
    recipient_masked: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(32))  # sent, rejected, retry, paused, unknown, found
    http_status: Mapped[int | None] = mapped_column(Integer)
    provider_status: Mapped[str | None] = mapped_column(String(64))
    provider_id: Mapped[str | None] = mapped_column(String(191))
    detail: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "idempotency_key"), Index(None, "created_at"))


class RateWindow(Base):
    """Fixed-window counters shared by every worker on every host (one row per bucket and window)."""

    __tablename__ = "cronbox_rate_windows"

    bucket: Mapped[str] = mapped_column(String(64), primary_key=True)
    window_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # unix seconds
    used: Mapped[int] = mapped_column(BigInteger, default=0)  # count; or, for at_most_every, a time in ms


class ChannelPause(Base):
    """A channel that must not send until `paused_until` (out of credit, bad credentials)."""

    __tablename__ = "cronbox_channel_pauses"

    channel: Mapped[str] = mapped_column(String(32), primary_key=True)
    paused_until: Mapped[datetime] = mapped_column(UtcDateTime)
    reason: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


# ---- operations: scheduler slots, one-off runs, alert state ---------------------------


class ScheduleRun(Base):
    """One row per (task, slot): the unique key is what makes a slot run at most once,
    even with overlapping ticks or several servers sharing the database."""

    __tablename__ = "cronbox_schedule_runs"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    task: Mapped[str] = mapped_column(String(191))
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

    problem: Mapped[str] = mapped_column(String(191), primary_key=True)
    failing: Mapped[bool] = mapped_column(Boolean)
    detail: Mapped[str | None] = mapped_column(String(500))
    since: Mapped[datetime] = mapped_column(UtcDateTime)
    last_alerted_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


# ---- operator console: sessions and the log of what the operator did ---------------------


OPS_SESSION_IDLE = timedelta(hours=2)  # a console session ends after this long without a request...
OPS_SESSION_ABSOLUTE = timedelta(hours=12)  # ...and this long after login, however busy


class OperatorSession(Base):
    """A logged-in browser. The cookie carries a random id; only its SHA-256 is stored, so a
    database dump opens no session. Logout or a password change deletes rows: a copied cookie
    stops working at once, which a signed cookie alone could not promise."""

    __tablename__ = "cronbox_ops_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    seen_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)  # absolute end, whatever the activity
    password_fingerprint: Mapped[str] = mapped_column(String(16))  # of the password hash in force at login
    client_ip: Mapped[str | None] = mapped_column(String(45))
    user_agent: Mapped[str | None] = mapped_column(String(255))

    __table_args__ = (Index(None, "expires_at"),)


class OperatorAction(Base):
    """Append-only: every console action (and login, logout, failed login) with operator and time."""

    __tablename__ = "cronbox_ops_actions"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime)
    operator: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str | None] = mapped_column(String(255))
    outcome: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(String(500))
    client_ip: Mapped[str | None] = mapped_column(String(45))

    __table_args__ = (Index(None, "at"),)
