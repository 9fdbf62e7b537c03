"""Job handlers and dispatch(): slow side effects (SMS, e-mail, notifications) as queued jobs.

A job is added to the caller's transaction, like an outbox event: a request
that rolls back leaves no job, and the worker never sees an uncommitted one.
Payments and escrow never go through here; they run synchronously in the
domain transaction.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Protocol, cast

from sqlalchemy import Table, insert, select, update

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import PayloadError, RegistrationError
from cronbox.outbox.core.inserts import check_text, connection_of, delay_seconds, new_trace_id
from cronbox.outbox.core.payload import dump_payload, payload_bytes
from cronbox.outbox.core.sealing import BY_DEFAULT, JOBS, Sealer, Sealing, sealer_for
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.core.sql import insert_ignore_id
from cronbox.outbox.engine.backoff import Backoff
from cronbox.outbox.engine.registry import DEFAULT, Jobs, Registry
from cronbox.outbox.queue import batches, groups, results
from cronbox.outbox.queue.models import READY, Job
from cronbox.outbox.queue.ratelimit import RateLimit
from cronbox.outbox.core.session_types import Transactional

QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}\Z")  # \Z: `$` would take a final newline
J = cast(Table, Job.__table__)
# Built once; SQLAlchemy compiles it once per dialect and keeps it in the engine's compiled cache.
_INSERT = insert(J)


@dataclass(frozen=True)
class JobHandler:
    name: str
    queue: str
    fn: Callable = field(repr=False)
    tries: int
    backoff: Backoff = field(repr=False)
    timeout: float
    unique: bool
    retry_until: float | None  # seconds after dispatch during which RetryLater may postpone the job
    rate_limit: RateLimit | Callable | None = None  # or fn(settings) -> RateLimit | None, read per run
    channel: str | None = None  # jobs wait while this channel is paused (outbox.queue.pauses)
    grouped: bool = False  # group commit: see job()
    concurrency_group: str | None = None  # at most concurrency_limit of its jobs run at once (outbox.queue.groups)
    concurrency_limit: int | None = None
    cost: int = 1  # what one run spends of its queue's and group's cost budgets
    jobs: Jobs | None = field(default=None, repr=False, compare=False)  # where registered: the groups dispatch may name
    module: str | None = None  # a Celery task's (no fn): the module that declared it (outbox.engine.registry)
    sealed: Sealing = False  # payloads stored as envelopes (outbox.core.sealing): see job()

    @property
    def max_attempts(self) -> int:
        return self.tries

    @property
    def origin(self) -> tuple | None:
        """A Celery task (no function of ours) is the same registration only on the same queue; a
        function's job is its function's (outbox.engine.registry._origin)."""
        return ("celery_task", self.queue) if self.fn is None else None

    def dispatch(self, session: Transactional, payload=None, *, delay: float | timedelta = 0,
                 unique_key: str | None = None, concurrency_group: str | None = None,
                 cost: int | None = None, batch: Any = None, idempotency_key: str | None = None) -> int | None:
        """Add this job to the caller's transaction (a Session, scoped session or Core Connection,
        like record(): the INSERT runs on that transaction's connection, never flushing the caller's
        pending objects); returns its id, or None when a job with the same unique key is already
        waiting or running (then nothing is added and the caller's transaction is untouched).

        concurrency_group / cost: this run's own, instead of the handler's; the group must be one a
        registered job declares (with its concurrency_limit).

        batch: a `cronbox.batch()` (or `ctx.batch` in a member's handler): the job is a member of it
        (outbox.queue.batches). idempotency_key: a dispatch with a key a job already has returns that
        job's id instead of adding one, while the job waits or runs and for CRONBOX_IDEMPOTENCY_TTL
        after it finished (its result readable by `result()`): a retried request gets the same job.
        unique_key differs: it only keeps a second job out while one waits or runs, and returns None."""
        body = dump_payload(payload)
        seconds = delay_seconds(delay)
        for name, key in (("unique_key", unique_key), ("idempotency_key", idempotency_key)):
            check_text(key, name, limit=None, optional=True)  # a long one is hashed (_stored_key)
        if concurrency_group is not None:
            groups.check_group(concurrency_group, None, error=PayloadError)
            if self.grouped:
                raise PayloadError(f"{self.name} is grouped=True: it cannot run in a concurrency group")
            if concurrency_group not in groups.limits(self.jobs or DEFAULT.jobs):
                raise PayloadError(f"concurrency group {concurrency_group!r} is not declared: give some "
                                   f"@job concurrency_group={concurrency_group!r} and its concurrency_limit")
        if cost is not None:
            groups.check_cost(cost, error=PayloadError)
        sealer = sealer_for(sealed=self.sealed, what=f"job {self.name}")
        if unique_key is None and self.unique:
            stored_key: str | None = default_unique_key(self.name, body, sealer)
        else:
            stored_key = _stored_key(self.name, unique_key) if unique_key else None
        connection = connection_of(session, Job)
        seal_id = None
        if sealer is not None:  # one AEAD call, in memory: the INSERT below stays the only statement
            body, seal_id = sealer.seal(connection, JOBS, self.name, body)
        now = clock.utcnow()
        row = {
            "queue": self.queue,
            "handler": self.name,
            "payload": body,
            "payload_bytes": payload_bytes(body),
            "status": READY,
            "attempts": 0,
            "available_at": now + timedelta(seconds=seconds),
            "unique_key": stored_key,
            "retry_until": now + timedelta(seconds=self.retry_until) if self.retry_until is not None else None,
            "trace_id": new_trace_id(),
            "created_at": now,
            "concurrency_group": concurrency_group,
            "cost": cost,
            "seal_id": seal_id,
        }
        if batch is not None:  # issue 39: a member (outbox.queue.batches)
            row["batch_id"] = batches.admit(connection, batch, self)
        if idempotency_key is not None:
            row["idempotency_key"] = _stored_key(self.name, idempotency_key)
            job_id = _dispatch_once(connection, row, now)
        elif row["unique_key"] is None:
            job_id = connection.execute(_INSERT, row).inserted_primary_key[0]  # type: ignore[index]  # one INSERT
        else:
            job_id = insert_ignore_id(connection, J, row)
        if batch is not None:
            batches.joined(connection, batch, job_id)  # a batch created empty in this transaction: open again
        return job_id

    def result(self, session: Transactional, job_id: int) -> results.JobResult:
        """What job `job_id` returned (read on `session`): a JobResult whose `status` is done (its `value`), pending, failed
        (its `error`), expired (after CRONBOX_RESULT_TTL) or unknown (no such job, or pruned)."""
        connection = connection_of(session, Job)
        return results.read(connection, job_id, clock.utcnow())  # type: ignore[arg-type]




def _dispatch_once(connection, row: dict, now) -> int | None:
    """A dispatch with an idempotency key: the new job's id, or the id of the job holding the key. A job
    whose key outlived CRONBOX_IDEMPOTENCY_TTL (`idempotency_until` passed) gives it up here, guarded by
    that time, and the job is added after all. Two requests with one key at once: the second INSERT
    waits on the first's uncommitted key (the unique index), then finds it committed (READ COMMITTED:
    the read after it is a new snapshot) or rolled back (and adds its own). None only when the
    conflict was the unique_key's."""
    for _ in range(2):
        job_id = insert_ignore_id(connection, J, row)
        if job_id is not None:
            return job_id
        held = connection.execute(select(J.c.id, J.c.idempotency_until).where(
            J.c.idempotency_key == row["idempotency_key"])).first()
        if held is None:
            return None  # the unique_key's conflict
        if held.idempotency_until is None or held.idempotency_until > now:
            return held.id
        connection.execute(update(J).where(J.c.id == held.id, J.c.idempotency_until <= now)
                           .values(idempotency_key=None))
    return None


def default_unique_key(handler: str, body: str, sealer: Sealer | None, key_id: str | None = None) -> str:
    """The unique key a unique job dispatched without one stores (as `_stored_key`): a hash of its dumped
    payload `body`; sealed (`sealer`), a keyed one (Sealer.fingerprint, under the active master key, or
    `key_id`'s), since a bare hash of a phone number is found by trying every number. `storage
    seal-payloads` and `rewrap` recompute it to tell a waiting row's default key from one its caller gave,
    and replace it (cronbox.storage.payload_maintenance)."""
    key = hashlib.sha256(body.encode()).hexdigest() if sealer is None else sealer.fingerprint(handler, body, key_id)
    return _stored_key(handler, key)


def _stored_key(handler: str, key: str) -> str:
    """Unique keys are per handler; long ones are hashed to fit the column."""
    stored = f"{handler}:{key}"
    if len(stored) <= NAME_MAX:
        return stored
    return f"{handler[:100]}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"


class Dispatch(Protocol):
    def __call__(self, session: Transactional, payload: Any = None, *, delay: float | timedelta = 0,
                 unique_key: str | None = None, concurrency_group: str | None = None,
                 cost: int | None = None, batch: Any = None, idempotency_key: str | None = None) -> int | None: ...


class ResultOf(Protocol):
    def __call__(self, session: Transactional, job_id: int) -> results.JobResult: ...


class JobFunction(Protocol):
    """A function `@job` registered: called as before, plus `.dispatch(session, payload)`,
    `.result(session, job_id)` and `.job`."""
    dispatch: Dispatch
    result: ResultOf
    job: JobHandler

    def __call__(self, payload: Any, ctx: Any, /) -> Any: ...


def job(queue: str = "default", *, name: str | None = None, tries: int = 5, backoff=5, timeout: float = 30,
        unique: bool = False, retry_until: float | timedelta | None = None,
        rate_limit: str | RateLimit | Callable[[Any], RateLimit | None] | None = None,
        channel: str | None = None, grouped: bool = False, concurrency_group: str | None = None,
        concurrency_limit: int | None = None, cost: int = 1, sealed: Sealing = False,
        registry: Registry | None = None) -> Callable[[Callable[..., Any]], JobFunction]:
    """Register `fn(payload, ctx)` as a job on `queue`; the decorated function gets `.dispatch()`.

    name: the job's identity, stored in its rows (default module.qualname). tries: attempts before the
    job fails. timeout: seconds an attempt may run (its lease is this plus CRONBOX_LEASE_MARGIN).
    concurrency_group, concurrency_limit: at most `concurrency_limit` jobs of the group run at once,
    over every worker sharing the database. cost: what one run spends of its queue's and group's
    cost budgets (CRONBOX_QUEUE_BUDGETS, CRONBOX_GROUP_BUDGETS). Raises `RegistrationError` (a
    `CronboxError`) for a bad argument, a clash with another job's name, or a group given two limits.

    backoff: base seconds (doubling, capped at 15 min, +-20% jitter) or a list of delays.
    unique: while a job with the same unique key waits or runs, dispatch is a no-op (the key
    defaults to a hash of the payload). retry_until: how long after dispatch RetryLater may keep
    postponing it before it fails. rate_limit: "N/s", "N/m" or "N/h", shared by every worker.
    channel: the job waits (no attempt used) while that channel is paused.
    grouped=True (group commit, for jobs that make no network calls and only write through
    ctx.session): up to CRONBOX_GROUP_MAX (50) consecutive grouped jobs commit in one transaction,
    each in its own SAVEPOINT with its ack. A failing job rolls back only its own writes; when the
    whole transaction is lost (timeout, deadlock, dropped connection) the others run again one per
    transaction, without losing an attempt. The transaction stays open at most CRONBOX_GROUP_MS
    (200 ms) past its first job, so a web request waiting on a row lock a grouped job took waits at
    most that long. Not with channel= or rate_limit= (their checks write in transactions of their
    own); ctx.commit_now() is refused in a grouped job.
    sealed=True: its payloads are stored as AES-256-GCM envelopes under the app's key vault (one AEAD
    call in dispatch(), opened only in the worker's memory; docs/howto/sealed-payloads.md); a
    dispatch where no vault is configured is refused. CRONBOX_SEAL_PAYLOADS=all seals every job.
    (The channel jobs say `sealed=outbox.core.sealing.BY_DEFAULT`: sealed wherever a key vault is
    usable, plain where none is, so an app upgraded without one keeps sending.)
    """
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise RegistrationError(f"queue name {queue!r} must be 1-64 letters, digits, or _ . : -")
    if not isinstance(tries, int) or isinstance(tries, bool) or tries < 1:
        raise RegistrationError(f"tries must be a positive integer, not {tries!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise RegistrationError(f"timeout must be a positive number of seconds, not {timeout!r}")
    if isinstance(retry_until, timedelta):
        retry_until = retry_until.total_seconds()
    if retry_until is not None and (isinstance(retry_until, bool) or not isinstance(retry_until, (int, float))
                                    or retry_until <= 0):
        raise RegistrationError(f"retry_until must be a positive number of seconds, not {retry_until!r}")
    if not isinstance(grouped, bool):
        raise RegistrationError(f"grouped must be True or False, not {grouped!r}")
    if grouped and (channel is not None or rate_limit is not None):
        raise RegistrationError("grouped=True cannot be combined with channel= or rate_limit= "
                                "(a grouped job makes no network calls)")
    if concurrency_group is not None or concurrency_limit is not None:
        if concurrency_group is None or concurrency_limit is None:
            raise RegistrationError("concurrency_group= and concurrency_limit= go together")
        groups.check_group(concurrency_group, concurrency_limit)
        if grouped:
            raise RegistrationError("grouped=True cannot be combined with concurrency_group= "
                                    "(its slot is taken and freed in transactions of their own)")
    groups.check_cost(cost)
    if not isinstance(sealed, bool) and sealed != BY_DEFAULT:
        raise RegistrationError(f"sealed must be True or False, not {sealed!r}")
    policy = Backoff.of(backoff)
    limit = RateLimit.parse(rate_limit, bucket=f"queue:{queue}") if isinstance(rate_limit, str) else rate_limit
    if limit is not None and not isinstance(limit, RateLimit) and not callable(limit):
        raise RegistrationError("rate_limit must be like '10/s', a RateLimit, or a function of the settings")

    def register(fn: Callable[..., Any]) -> JobFunction:
        job_name = name or f"{fn.__module__}.{fn.__qualname__}"
        if len(job_name) > NAME_MAX - 60:
            raise RegistrationError(f"job name {job_name[:40]!r}... is too long")
        jobs = (registry or DEFAULT).jobs
        other = next((h for h in jobs.all() if concurrency_group is not None and h.name != job_name
                      and h.concurrency_group == concurrency_group and h.concurrency_limit != concurrency_limit), None)
        if other is not None:
            raise RegistrationError(f"concurrency group {concurrency_group!r} has limit {other.concurrency_limit} "
                                    f"({other.name}), not {concurrency_limit}: one group, one limit")
        handler = JobHandler(job_name, queue, fn, tries, policy, float(timeout), unique, retry_until, limit, channel,
                             grouped, concurrency_group, concurrency_limit, cost, jobs, sealed=sealed)
        jobs.add(handler)
        registered = cast(JobFunction, fn)
        registered.dispatch = handler.dispatch
        registered.result = handler.result
        registered.job = handler
        return registered

    return register
