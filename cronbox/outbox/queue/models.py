"""Tables of the job queue: jobs, shared rate-limit windows, channel pauses, concurrency-group slots."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from cronbox.outbox.core.models import Base, ExactString, Id, LongText, UtcDateTime
from cronbox.outbox.core.text import NAME_MAX

# Job statuses. `available_at` is when a job may be claimed: its due time while
# ready, its lease expiry while reserved, NULL once finished. Claims read one
# index range: (queue, status, available_at <= now).
READY, RESERVED, DONE, FAILED = "ready", "reserved", "done", "failed"


class Job(Base):
    """One job: dispatched in the caller's transaction (status ready), claimed by a worker under a lease
    (reserved, `claim_token`), then done, ready again for a retry (attempts, `available_at`, last error)
    or failed; `unique_key` keeps one waiting or running job per key."""

    __tablename__ = "cronbox_jobs"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    queue: Mapped[str] = mapped_column(ExactString(64))
    handler: Mapped[str] = mapped_column(ExactString(NAME_MAX))
    payload: Mapped[str] = mapped_column(LongText)
    # The payload's size in UTF-8 bytes, written with it: the claim bounds a batch by it without
    # reading a payload (outbox.engine.claim). NULL: unknown (a row older than migration 0013).
    payload_bytes: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=READY)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    available_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    claim_token: Mapped[str | None] = mapped_column(ExactString(32))
    # Set while the job is waiting or running; cleared when it finishes or fails for
    # good, which frees the key for the next dispatch (NULLs never collide).
    unique_key: Mapped[str | None] = mapped_column(ExactString(NAME_MAX), unique=True)
    retry_until: Mapped[datetime | None] = mapped_column(UtcDateTime)
    trace_id: Mapped[str] = mapped_column(String(32))
    # A sealed payload's row identity (outbox.core.sealing), written with it; NULL: plaintext.
    seal_id: Mapped[str | None] = mapped_column(String(32), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    reserved_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_error: Mapped[str | None] = mapped_column(String(1000))
    error_class: Mapped[str | None] = mapped_column(String(NAME_MAX))
    traceback: Mapped[str | None] = mapped_column(Text)
    # A dispatch's own concurrency group and cost; NULL: the handler's (see outbox.queue.groups).
    concurrency_group: Mapped[str | None] = mapped_column(ExactString(64))
    cost: Mapped[int | None] = mapped_column(Integer)
    # Issue 39 (outbox.queue.batches): the batch this job is a member of (NULL: none); and what its
    # outcome transaction does next, as JSON (NULL for nearly every job): a chain's rest, or which
    # batch's callback it is.
    batch_id: Mapped[int | None] = mapped_column(Id)
    flow: Mapped[str | None] = mapped_column(LongText)
    # dispatch(idempotency_key=): the same key returns this job until `idempotency_until` (unlike
    # unique_key, it outlives the job's end: a retried request gets the same job, and its result).
    idempotency_key: Mapped[str | None] = mapped_column(ExactString(191), unique=True)
    idempotency_until: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (
        Index(None, "queue", "status", "available_at", "id"),
        Index(None, "status", "finished_at"),
        Index(None, "batch_id", "status"),
    )


class JobBatch(Base):
    """A batch of jobs (outbox.queue.batches): its callbacks, and counters of its members' final outcomes,
    each raised once per ack statement by the transaction that writes those outcomes. Its members are the
    jobs whose `batch_id` is its id; `finished_at` is set, once, by the transaction that finished the last."""

    __tablename__ = "cronbox_batches"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(191))
    callbacks: Mapped[str] = mapped_column(Text)  # JSON: {"then"|"catch"|"finally": [job, queue, retry_until]}
    payload: Mapped[str] = mapped_column(LongText)  # given to the callbacks
    allow_failures: Mapped[bool] = mapped_column(Boolean, default=False)
    done: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    cancelled: Mapped[int] = mapped_column(Integer, default=0)
    trace_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    failed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)  # its first member failure
    cancelled_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "finished_at"),)


class JobResult(Base):
    """A job's return value (JSON), written in the transaction that made it done, kept until `expires_at`
    (CRONBOX_RESULT_TTL). `batch_id`: its job's batch, so a batch's `then` pages through its members'."""

    __tablename__ = "cronbox_job_results"

    job_id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=False)
    batch_id: Mapped[int | None] = mapped_column(Id)
    value: Mapped[str] = mapped_column(LongText)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)

    __table_args__ = (Index(None, "batch_id", "job_id"), Index(None, "expires_at"))


class RateWindow(Base):
    """Fixed-window counters shared by every worker on every host (one row per bucket and window)."""

    __tablename__ = "cronbox_rate_windows"

    bucket: Mapped[str] = mapped_column(ExactString(64), primary_key=True)
    window_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # unix seconds
    used: Mapped[int] = mapped_column(BigInteger, default=0)  # count; or, for at_most_every, a time in ms


class ChannelPause(Base):
    """A channel that must not send until `paused_until` (out of credit, bad credentials)."""

    __tablename__ = "cronbox_channel_pauses"

    channel: Mapped[str] = mapped_column(ExactString(32), primary_key=True)
    paused_until: Mapped[datetime] = mapped_column(UtcDateTime)
    reason: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class ConcurrencyGroupSlot(Base):
    """One slot of a concurrency group (0 .. limit-1), shared by every worker on every host.

    Free when `holder` is NULL or `lease_until` has passed: a killed holder's slot frees itself."""

    __tablename__ = "cronbox_group_slots"

    group_name: Mapped[str] = mapped_column(ExactString(64), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str | None] = mapped_column(ExactString(64))
    lease_until: Mapped[datetime | None] = mapped_column(UtcDateTime)
    taken_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
