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

from sqlalchemy import Table, insert

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import PayloadError, RegistrationError
from cronbox.outbox.core.inserts import check_text, connection_of, delay_seconds, new_trace_id
from cronbox.outbox.core.payload import dump_payload, payload_bytes
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.core.sql import insert_ignore_id
from cronbox.outbox.engine.backoff import Backoff
from cronbox.outbox.engine.registry import DEFAULT, Jobs, Registry
from cronbox.outbox.queue import groups
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
                 cost: int | None = None) -> int | None:
        """Add this job to the caller's transaction (a Session, scoped session or Core Connection,
        like record(): the INSERT runs on that transaction's connection, never flushing the caller's
        pending objects); returns its id, or None when a job with the same unique key is already
        waiting or running (then nothing is added and the caller's transaction is untouched).

        concurrency_group / cost: this run's own, instead of the handler's; the group must be one a
        registered job declares (with its concurrency_limit)."""
        body = dump_payload(payload)
        seconds = delay_seconds(delay)
        check_text(unique_key, "unique_key", limit=None, optional=True)  # a long one is hashed (_stored_key)
        if concurrency_group is not None:
            groups.check_group(concurrency_group, None, error=PayloadError)
            if self.grouped:
                raise PayloadError(f"{self.name} is grouped=True: it cannot run in a concurrency group")
            if concurrency_group not in groups.limits(self.jobs or DEFAULT.jobs):
                raise PayloadError(f"concurrency group {concurrency_group!r} is not declared: give some "
                                   f"@job concurrency_group={concurrency_group!r} and its concurrency_limit")
        if cost is not None:
            groups.check_cost(cost, error=PayloadError)
        if unique_key is None and self.unique:
            unique_key = hashlib.sha256(body.encode()).hexdigest()
        now = clock.utcnow()
        row = {
            "queue": self.queue,
            "handler": self.name,
            "payload": body,
            "payload_bytes": payload_bytes(body),
            "status": READY,
            "attempts": 0,
            "available_at": now + timedelta(seconds=seconds),
            "unique_key": _stored_key(self.name, unique_key) if unique_key else None,
            "retry_until": now + timedelta(seconds=self.retry_until) if self.retry_until is not None else None,
            "trace_id": new_trace_id(),
            "created_at": now,
            "concurrency_group": concurrency_group,
            "cost": cost,
        }
        connection = connection_of(session, Job)
        if row["unique_key"] is None:
            return connection.execute(_INSERT, row).inserted_primary_key[0]  # type: ignore[index]  # one INSERT
        return insert_ignore_id(connection, J, row)


def _stored_key(handler: str, key: str) -> str:
    """Unique keys are per handler; long ones are hashed to fit the column."""
    stored = f"{handler}:{key}"
    if len(stored) <= NAME_MAX:
        return stored
    return f"{handler[:100]}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"


class Dispatch(Protocol):
    def __call__(self, session: Transactional, payload: Any = None, *, delay: float | timedelta = 0,
                 unique_key: str | None = None, concurrency_group: str | None = None,
                 cost: int | None = None) -> int | None: ...


class JobFunction(Protocol):
    """A function `@job` registered: called as before, plus `.dispatch(session, payload)` and `.job`."""
    dispatch: Dispatch
    job: JobHandler

    def __call__(self, payload: Any, ctx: Any, /) -> Any: ...


def job(queue: str = "default", *, name: str | None = None, tries: int = 5, backoff=5, timeout: float = 30,
        unique: bool = False, retry_until: float | timedelta | None = None,
        rate_limit: str | RateLimit | Callable[[Any], RateLimit | None] | None = None,
        channel: str | None = None, grouped: bool = False, concurrency_group: str | None = None,
        concurrency_limit: int | None = None, cost: int = 1,
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
                             grouped, concurrency_group, concurrency_limit, cost, jobs)
        jobs.add(handler)
        registered = cast(JobFunction, fn)
        registered.dispatch = handler.dispatch
        registered.job = handler
        return registered

    return register
