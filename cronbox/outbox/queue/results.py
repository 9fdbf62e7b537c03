"""A job's result: what its handler returned (JSON), stored with its `done` (issue 39).

The handler's return value reaches the runner on its Outcome (`Outcome.value`); the job family's
outcomes keep it as JSON for the ack (outbox.engine.outcomes.Outcomes.returned with the job
family's `keep_value`, outbox.queue.job_family) before the outcome is written (`encode`: one that is not JSON, or larger than
CRONBOX_RESULT_MAX, makes the attempt a permanent failure, recorded like any other: nothing is
lost, the job shows why), and the ack that makes the job done inserts it here in the same
transaction (`insert`, one multi-row INSERT per ack statement, only for jobs that returned
something: a handler returning None, nearly all of them, costs nothing). It is kept
CRONBOX_RESULT_TTL (a duration with its unit), then the daily retention deletes it.

`read` is what `job_fn.result(session, job_id)` returns: a `JobResult` whose `status` says which
case it is (pending, done, failed, expired, unknown), never an exception for an id it does not know.

A sealed job's result is sealed too (`seal`: the job's row has a seal id), as an envelope bound to its
job id (outbox.core.sealing.RESULTS, docs/sealed-format.md "Results and chains"), under the current
sealer, in the ack's transaction; `read` and `of_batch` open it in the reader's memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterator

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.core.payload import dump_payload, payload_bytes
from cronbox.outbox.core.sealing import RESULTS, open_payload, result_seal_id, sealer_for
from cronbox.outbox.queue.models import DONE, FAILED, Job, JobResult as ResultRow

J = Job.__table__
R = ResultRow.__table__
_INSERT = insert(R)

RESULT_TTL_DEFAULT = 7 * 86400.0  # CRONBOX_RESULT_TTL
RESULT_TTL_BOUNDS, RESULT_TTL_WHY = (60.0, 366 * 86400.0), "1m and 366d"
RESULT_MAX_DEFAULT = 64 * 1024  # CRONBOX_RESULT_MAX, bytes of JSON
PENDING, EXPIRED, UNKNOWN = "pending", "expired", "unknown"


def ttl(settings) -> float:
    """CRONBOX_RESULT_TTL in seconds (a unit required: outbox.core.durations)."""
    return settings.duration("CRONBOX_RESULT_TTL", RESULT_TTL_DEFAULT, bounds=RESULT_TTL_BOUNDS, why=RESULT_TTL_WHY)


def max_bytes(settings) -> int:
    return int(settings.number("CRONBOX_RESULT_MAX", RESULT_MAX_DEFAULT, minimum=1))


class ResultError(PayloadError):
    """A handler's return value that cannot be stored as its result (not JSON, or too large)."""


def encode(value: Any, limit: int) -> str:
    """The JSON text of a handler's return value; ResultError (one line) when it cannot be stored."""
    try:
        text = dump_payload(value)
    except PayloadError as exc:
        raise ResultError(f"ResultError: the return value is not JSON: {str(exc).replace('payload', 'result', 1)}") \
            from None
    except RecursionError:
        raise ResultError("ResultError: the return value is not JSON: it contains itself") from None
    size = payload_bytes(text)
    if size > limit:
        raise ResultError(f"ResultError: the return value is {size} bytes of JSON, over CRONBOX_RESULT_MAX ({limit})")
    return text


def seal(session: Session, items: list, values: dict[int, str]) -> dict[int, str]:
    """`values` (job id -> JSON) with the results of sealed jobs (their rows have a seal id) sealed."""
    sealed = [item for item in items if item.id in values and item.seal_id is not None]
    if not sealed:
        return values
    connection = session.connection()
    sealer = sealer_for(sealed=True, what=f"the result of job {sealed[0].id}")
    assert sealer is not None  # sealed=True: NoVault otherwise
    return {**values, **{item.id: sealer.seal_with(connection, RESULTS, result_seal_id(item.id), "", values[item.id])
                         for item in sealed}}


def value_of(connection, job_id: int, text: str) -> Any:
    """A stored result's JSON value, opened first when sealed (under the current sealer)."""
    return open_payload(None, RESULTS, "", result_seal_id(job_id), text, connection)


def _connection(session):
    return session.connection() if isinstance(session, Session) else session


def insert_results(session: Session, rows: list[tuple[int, int | None, str]], now: datetime, keep: float) -> None:
    """(job id, batch id, JSON) of jobs this transaction made done: one INSERT for them all."""
    if rows:
        expires = now + timedelta(seconds=keep)
        session.execute(_INSERT, [{"job_id": job_id, "batch_id": batch_id, "value": value, "expires_at": expires}
                                  for job_id, batch_id, value in rows])


@dataclass(frozen=True)
class JobResult:
    """What `job_fn.result(session, job_id)` says of a job.

    status: "done" (value: what its handler returned, None if it returned nothing), "pending" (ready,
    waiting or running: value None), "failed" (error: its last error), "expired" (done, its result
    deleted after CRONBOX_RESULT_TTL), "unknown" (no such job, or one pruned with its result)."""
    status: str
    value: Any = None
    error: str | None = None

    @property
    def ready(self) -> bool:
        """Is there nothing more to wait for (done, failed, expired or unknown)?"""
        return self.status != PENDING


def read(session: Session, job_id: int, now: datetime) -> JobResult:
    """One job's result, in two primary-key reads at most."""
    stored = session.execute(select(R.c.value, R.c.expires_at).where(R.c.job_id == job_id)).first()
    if stored is not None and stored.expires_at > now:
        return JobResult(DONE, value_of(_connection(session), job_id, stored.value))
    row = session.execute(select(J.c.status, J.c.last_error).where(J.c.id == job_id)).first()
    if row is None:
        return JobResult(EXPIRED if stored is not None else UNKNOWN)
    if row.status == DONE:
        return JobResult(EXPIRED) if stored is not None else JobResult(DONE)
    if row.status == FAILED:
        return JobResult(FAILED, error=row.last_error)
    return JobResult(PENDING)


def of_batch(session: Session, batch_id: int, now: datetime, *, page_size: int = 500) -> Iterator[tuple[int, Any]]:
    """(job id, value) of a batch's members that returned something, in job id order, read a page
    at a time (the (batch_id, job_id) index): a large batch's `then` never holds them all."""
    after = 0
    while True:
        rows = session.execute(select(R.c.job_id, R.c.value).where(R.c.batch_id == batch_id, R.c.job_id > after,
                                                                   R.c.expires_at > now)
                               .order_by(R.c.job_id).limit(page_size)).all()
        for row in rows:
            yield row.job_id, value_of(_connection(session), row.job_id, row.value)
        if len(rows) < page_size:
            return
        after = rows[-1].job_id


def prune(session: Session, now: datetime, batch: int) -> int:
    """Delete up to `batch` results past their time (the (expires_at) index)."""
    ids = list(session.scalars(select(R.c.job_id).where(R.c.expires_at <= now).order_by(R.c.expires_at).limit(batch)))
    if ids:
        session.execute(delete(R).where(R.c.job_id.in_(ids)))
    return len(ids)
