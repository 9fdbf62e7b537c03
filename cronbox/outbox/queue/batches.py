"""Batches and chains: work made of several jobs, finished exactly once (issue 39).

A batch is a `cronbox_batches` row and its members, the jobs whose `batch_id` is its id, all
dispatched in the caller's transaction (`create`, then `dispatch(..., batch=)`: a rollback leaves
neither). Each member's final outcome (done; failed after its last try; cancelled) is written by
jobstore's token-guarded writes, and in that same transaction (`on_done`, `on_failed`, `cancel`):

1. the batch's counter of that outcome is raised, ONE UPDATE per batch per ack statement (the
   QuietAcks of a claimed batch, a group's acks, a handler's own transaction), by the number of
   that batch's members the statement made done (its rowcount: the token guard makes each member's
   final write happen once, so each member is counted once). That UPDATE takes the batch row's lock;
2. still holding it, one read asks whether any member is still pending (ready or reserved: the
   (batch_id, status) index, stopping at the first) and whether the batch is finished already;
3. if none is pending and it is not, this transaction sets `finished_at` and dispatches the
   callbacks (`then`, `finally`): INSERTs of job rows, committed with the member's outcome.

Why exactly one transaction fires, with members finishing at once in two workers. Every final
write of a member comes BEFORE its transaction takes the batch lock (step 1), and the check (step
2) comes after. Say T1 and T2 finish the last two members, A and B. Whichever takes the lock
first, T1, reads B as pending: T2's write of B is not committed, and T2 cannot commit before it
has the lock T1 holds, so nothing T1 reads can show B finished. T1 commits without firing. T2 then
gets the lock and its check reads A finished (committed before T2's lock was granted) and B
finished (its own write): it fires. Neither can fire early (a pending member is seen as pending
until it commits), and never both (`finished_at`, written under the lock, is read under it).
What this needs of each backend, at READ COMMITTED as cronbox runs (outbox.core.engines):

- MariaDB/MySQL, either claim mode (SKIP LOCKED or the token path: they differ only in how the claim
  finds rows, never in these writes): the counter UPDATE by primary key waits for the row lock and
  applies to the latest committed version; the check is a consistent read, and at READ COMMITTED
  each one takes a fresh snapshot, so it sees every commit made before it started (T1's, once T2's
  lock is granted) plus this transaction's own writes.
- PostgreSQL: the UPDATE waits for T1 to end, then re-reads the row's newest version (its
  EvalPlanQual re-check) before raising it; the check, a new statement, has a new snapshot taken
  after the lock was granted.
- SQLite: one writer at a time (BEGIN IMMEDIATE): the transactions are serial.

The members do not serialise on the row: a worker takes its lock once per ack statement per batch
(a hundred members acked in one UPDATE raise the counter once), held only from that UPDATE to the
COMMIT that follows it, and the claim, the handlers and the retries never touch it. A handler that
joins its ack to ctx.session holds it from its ack to its commit: the ack comes last, so that is
one statement long too. Locks are taken in batch id order (deadlock-free among acks). Members added
by a member's handler (`ctx.batch.add`) need no lock: the adding member is pending until the
transaction that inserts them commits with its own outcome, so the batch cannot finish before they
exist. Adding to an existing batch from anywhere else locks the batch row (SELECT ... FOR UPDATE)
and refuses a finished or cancelled batch.

A failed member: its counter, and the first failure (`failed_at`, set once under the lock)
dispatches `catch`; unless `allow_failures`, it also cancels the batch: the members still ready
are made failed as cancelled (error_class BatchCancelled) in the same transaction, so none of them
starts (a claim and this UPDATE lock the same rows: each member is either claimed or cancelled).
`then` runs when every member finished and none failed (any, with allow_failures=True), and the
batch was not cancelled; `finally` when every member finished, whatever they did.

A chain is the jobs themselves: each step's row carries the rest of the chain in `flow` (JSON), and
the transaction that makes a step done dispatches the next, with the step's result (`ctx.previous`
in the next handler); a step that fails after its tries dispatches the chain's `catch` instead, and
the chain stops. A chain ends in a batch, or a batch's `then` starts a chain, through the handlers:
`cronbox.batch(ctx.session, ...)` or `cronbox.chain(ctx.session, ...)` in a step or callback.

Queues forwarded to Celery are refused for members, chain steps and callbacks (a batch's then, catch
and finally, a chain's catch), at dispatch: their rows are done when the broker confirms the task
message (jobstore.ack_published), long before Celery runs the task, which gets no ctx.batch either.

Sealed payloads (outbox.core.sealing, docs/sealed-format.md "Results and chains"): a chain with a
sealed step (or catch) is sealed whole, each of its rows' payload and `flow` (the later steps'
payloads, the previous step's result) sealed under the row's seal id; the transaction that dispatches
its next step or its catch opens the flow and seals the new row. A batch with a sealed callback seals
its callbacks' rows. A sealed member's result is sealed (outbox.queue.results), opened when `then`
reads it (`ctx.batch.results()`). The batch's own payload (`batch(payload=)`) is stored as given.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterator

from sqlalchemy import delete, exists, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from cronbox.outbox.core import clock, paging
from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.core.payload import dump_payload, load_payload, payload_bytes
from cronbox.outbox.core.sealing import BY_DEFAULT, FLOWS, JOBS, Sealer, Sealing, is_sealed, open_payload, sealer_for
from cronbox.outbox.core.session_types import Transactional
from cronbox.outbox.core.text import ERROR_MAX, is_utf8
from cronbox.outbox.core.inserts import connection_of, new_trace_id
from cronbox.outbox.queue import chains, results
from cronbox.outbox.queue.models import DONE, FAILED, READY, RESERVED, Job, JobBatch

J = Job.__table__
B = JobBatch.__table__
_INSERT_JOB = insert(J)
THEN, CATCH, FINALLY = "then", "catch", "finally"
SEALED = "sealed"  # in a batch's callbacks: their rows are sealed (a callback declared sealed)
CANCELLED_CLASS = "BatchCancelled"
MAX_BATCH_NAME = 191
CELERY = "celery"


# ---- what callbacks and steps are -----------------------------------------------------

def spec_of(job: Any, role: str, what: str, registry: Any = None) -> list:
    """[name, queue, retry_until seconds] of a registered job given as its @job function, its
    JobHandler, or its name; PayloadError naming `role` otherwise, or for a job on a queue forwarded
    to Celery (refuse_celery: `what` it would have been)."""
    return _spec_and_handler(job, role, what, registry)[0]


def _spec_and_handler(job: Any, role: str, what: str, registry: Any = None) -> tuple[list, Any]:
    handler = getattr(job, "job", job)
    if isinstance(job, str):
        jobs = registry if registry is not None else _default_jobs()
        handler = jobs.get(job)
        if handler is None:
            raise PayloadError(f"{role}: no job named {job!r} is registered")
    name, queue, jobs = (getattr(handler, attr, None) for attr in ("name", "queue", "jobs"))
    if not isinstance(name, str) or not isinstance(queue, str) or not hasattr(handler, "tries"):
        raise PayloadError(f"{role} must be a @job function (or its name), not {type(job).__name__}")
    if jobs is not None and jobs.get(name) is not handler:
        raise PayloadError(f"{role}: {name} is not the job registered under that name")
    refuse_celery(handler, what)
    retry_until = getattr(handler, "retry_until", None)
    return [name, queue, retry_until], handler


def _sealing_of(handlers: list) -> Sealing:
    """How a chain or a batch's callbacks are sealed: as the most sealed of their jobs' declarations."""
    said = [getattr(handler, "sealed", False) for handler in handlers]
    return True if any(s is True for s in said) else BY_DEFAULT if BY_DEFAULT in said else False


def _default_jobs():
    from cronbox.outbox.engine.registry import DEFAULT  # the process's registry, for a job given by name

    return DEFAULT.jobs


def refuse_celery(handler: Any, what: str) -> None:
    """A member, chain step or callback on a queue forwarded to Celery is refused: its row is done at the
    broker's confirm (jobstore.ack_published), not when the task ran, so nothing could count it, follow
    it or give it its batch (ctx.batch) or chain."""
    forwarded = getattr(getattr(handler, "jobs", None), "forwarded", None)
    declared = forwarded.get(handler.queue) if forwarded is not None else None
    if getattr(handler, "fn", True) is None or (declared is not None and declared.protocol == CELERY):
        raise PayloadError(f"{handler.name} runs on queue {handler.queue}, forwarded to Celery: its job is done when "
                           f"the broker confirms the task message, before it runs, so it cannot be {what}")


def _job_row(spec: list, payload_text: str, now: datetime, *, connection: Connection,
             sealer: Sealer | None = None, flow: str | None = None, **extra) -> dict:
    """A job row of `spec` to INSERT: with `sealer`, its payload and flow sealed under a new seal id,
    as dispatch() seals a payload (one AEAD call each, in memory)."""
    name, queue, retry_until = spec[:3]
    seal_id = None
    if sealer is not None:
        payload_text, seal_id = sealer.seal(connection, JOBS, name, payload_text)
        if flow is not None:
            flow = sealer.seal_with(connection, FLOWS, seal_id, name, flow)
    return {"queue": queue, "handler": name, "payload": payload_text, "payload_bytes": payload_bytes(payload_text),
            "status": READY, "attempts": 0, "available_at": now, "unique_key": None,
            "retry_until": now + timedelta(seconds=retry_until) if retry_until is not None else None,
            "trace_id": new_trace_id(), "created_at": now, "concurrency_group": None, "cost": None,
            "seal_id": seal_id, "flow": flow, **extra}


def _flow(connection: Connection, item: Any, runtime: Any = None) -> dict:
    """A job's flow, opened in memory when its chain is sealed (under `runtime`'s keys, as its payload; in
    an outcome's transaction, under the current sealer's)."""
    return open_payload(runtime, FLOWS, item.handler, item.seal_id, item.flow, connection)


def _sealer_of_flow(item: Any) -> Sealer | None:
    """The sealer the rows a sealed chain's step dispatches (its next step, its catch) are sealed with."""
    return sealer_for(sealed=True, what=f"chain step job {item.id}") if is_sealed(item.flow) else None


def _dump(value: Any, what: str) -> str:
    try:
        return dump_payload(value)
    except RecursionError:
        raise PayloadError(f"{what} contains itself (a cycle): it is not JSON") from None


# ---- batches ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Progress:
    """A batch's progress: members done, failed (after their last try), cancelled, and pending
    (ready, waiting or running); `state` is running, finished or cancelled (finished after a cancel)."""
    id: int
    name: str
    done: int
    failed: int
    cancelled: int
    pending: int
    allow_failures: bool
    created_at: datetime
    failed_at: datetime | None
    cancelled_at: datetime | None
    finished_at: datetime | None

    @property
    def total(self) -> int:
        return self.done + self.failed + self.cancelled + self.pending

    @property
    def state(self) -> str:
        if self.finished_at is None:
            return "cancelling" if self.cancelled_at is not None else "running"
        return "cancelled" if self.cancelled_at is not None else "finished"


class Batch:
    """A batch of jobs (`cronbox.batch()`), or the one a job belongs to (`ctx.batch`): its `id` and `name`.

    `batch.add(session, job_fn, payload)` is `job_fn.dispatch(session, payload, batch=batch)`;
    `progress(session)`, `cancel(session)` and `results(session)` read and act on it. (`transaction`
    and `member` are cronbox's: the transaction that created it, and whether it is a member's ctx.batch.)"""

    def __init__(self, id: int, name: str | None = None, *, transaction: Any = None, member: bool = False,
                 empty: list[int] | None = None):
        self.id = id
        self.name = name
        self.transaction = transaction  # the transaction that created it (members added there need no lock)
        self.is_member = member  # ctx.batch of a member: the adding member keeps the batch open
        # The callback jobs an empty batch dispatched when created (see `create`), until its first member
        # joins in the creating transaction and takes them back (`joined`); None once it has a member.
        self.empty = empty

    def __repr__(self) -> str:
        return f"Batch(id={self.id}, name={self.name!r})"

    def add(self, session: Transactional, job: Any, payload: Any = None, **dispatch: Any) -> int | None:
        """Dispatch `job` (a @job function) with `payload` as a member, in `session`'s transaction;
        `dispatch`: the other arguments of its `.dispatch()` (delay, unique_key...)."""
        return job.dispatch(session, payload, batch=self, **dispatch)

    def progress(self, session: Transactional) -> Progress:
        """Its Progress, read on `session` (PayloadError if there is no such batch)."""
        found = progress(session, self.id)
        if found is None:
            raise PayloadError(f"no batch {self.id}")
        return found

    def cancel(self, session: Transactional) -> int:
        """Stop the members not started yet (in `session`'s transaction; see cancel_batch); returns how many."""
        return cancel(session, self.id, clock.utcnow())

    def results(self, session: Transactional, *, page_size: int = 500) -> Iterator[tuple[int, Any]]:
        """(job id, value) of the members that returned something (read on `session`), in job id order,
        `page_size` at a time."""
        return results.of_batch(_session_like(session), self.id, clock.utcnow(), page_size=page_size)

    def created_in(self, connection: Connection) -> bool:
        """Was it created in `connection`'s transaction, still open (so nobody else sees it yet)?"""
        transaction = connection.get_transaction()
        return transaction is not None and transaction is self.transaction and transaction.is_active


def _session_like(session: Transactional):
    return session if isinstance(session, (Session, Connection)) else connection_of(session, Job)


def batch(session: Transactional, *, name: str, then: Any = None, catch: Any = None, finally_: Any = None,
          allow_failures: bool = False, payload: Any = None) -> Batch:
    """A new batch, called `name` (in logs, the CLI and the console), in the caller's transaction
    (`session`); dispatch its members with `job_fn.dispatch(session,
    payload, batch=batch)` (or `batch.add(session, job_fn, payload)`) in the same transaction.

    `then` / `catch` / `finally_`: @job functions dispatched, exactly once, by the transaction that writes the
    outcome that decides them: `then` once every member is done (with allow_failures=True: finished,
    failed ones too) and the batch was not cancelled; `catch` at the first member failure (after its
    last try; unless allow_failures, the members not started are then cancelled); `finally_` once every
    member finished, however. Each gets `payload` (JSON) and `ctx.batch` (its progress, its members'
    results a page at a time). Raises PayloadError (a CronboxError) for a bad name, a callback that is
    not a registered @job or is on a queue forwarded to Celery, or a payload that is not JSON."""
    return create(session, name=name, then=then, catch=catch, finally_=finally_, allow_failures=allow_failures,
                  payload=payload)


def cancel_batch(session: Transactional, batch: Batch | int) -> int:
    """Cancel `batch` in `session`'s transaction: its members not started yet never start (failed as
    cancelled); `finally_` runs once the running ones finished, `then` never. Returns how many stopped."""
    return cancel(session, batch.id if isinstance(batch, Batch) else batch, clock.utcnow())


def create(session: Transactional, *, name: str, then: Any = None, catch: Any = None, finally_: Any = None,
           allow_failures: bool = False, payload: Any = None) -> Batch:
    """A new batch in the caller's transaction (see `batch`)."""
    if not isinstance(name, str) or not name or len(name) > MAX_BATCH_NAME or not name.isprintable() \
            or not is_utf8(name):
        raise PayloadError(f"a batch name must be printable text of 1 to {MAX_BATCH_NAME} characters, not {name!r}")
    if not isinstance(allow_failures, bool):
        raise PayloadError(f"allow_failures must be True or False, not {allow_failures!r}")
    found = {role: _spec_and_handler(job, f"{keyword}=", f"a batch's {keyword}= callback")
             for role, keyword, job in ((THEN, "then", then), (CATCH, "catch", catch), (FINALLY, "finally_", finally_))
             if job is not None}
    callbacks: dict[str, Any] = {role: spec for role, (spec, _handler) in found.items()}
    body = _dump(payload, "the batch's payload")
    connection = connection_of(session, JobBatch)
    if sealer_for(sealed=_sealing_of([handler for _spec, handler in found.values()]),
                  what=f"batch {name!r}'s callbacks") is not None:
        callbacks[SEALED] = True  # their rows are sealed, in whichever transaction dispatches them
    now = clock.utcnow()
    # Created finished, its `then` and `finally` dispatched: what an empty batch is when its transaction
    # commits (as Laravel's, Sidekiq's and GoodJob's empty batches: the callbacks at once). The first
    # member dispatched in this transaction takes that back (`joined`): nobody else sees either state.
    batch_id = connection.execute(insert(B), {
        "name": name, "callbacks": json.dumps(callbacks), "payload": body, "allow_failures": allow_failures,
        "done": 0, "failed": 0, "cancelled": 0, "trace_id": new_trace_id(), "created_at": now, "finished_at": now,
    }).inserted_primary_key[0]  # type: ignore[index]
    empty = [connection.execute(_INSERT_JOB, row).inserted_primary_key[0]  # type: ignore[index]
             for row in _callback_rows(connection, batch_id, name, callbacks, [THEN, FINALLY], body, now)]
    return Batch(batch_id, name, transaction=connection.get_transaction(), empty=empty)


def joined(connection: Connection, batch: Any, job_id: int | None) -> None:
    """After a dispatch to `batch`: if it is the first member of a batch created empty in this
    transaction (`create`), the batch is open again and the callbacks its creation dispatched are
    deleted, never seen by anyone. A dispatch that added no member (its unique_key or idempotency_key
    held by another job) leaves the batch empty, so finished."""
    if not isinstance(batch, Batch) or batch.empty is None or job_id is None:
        return
    if connection.execute(select(J.c.batch_id).where(J.c.id == job_id)).scalar() != batch.id:
        return
    if batch.empty:
        connection.execute(delete(J).where(J.c.id.in_(batch.empty), J.c.batch_id.is_(None)))
    connection.execute(update(B).where(B.c.id == batch.id).values(finished_at=None))
    batch.empty = None


def admit(connection: Connection, batch: Any, handler: Any) -> int:
    """The batch id a member joins, checked: a batch created in this very transaction (not visible to
    anyone else yet) or a member's own (ctx.batch: it keeps the batch open) as it is; any other
    batch locked (FOR UPDATE: a finisher waits for this transaction) and refused if finished or
    cancelled."""
    refuse_celery(handler, "a batch member")
    if isinstance(batch, Batch):
        batch_id = batch.id
        if batch.created_in(connection):
            return batch_id
        locked = not batch.is_member
    elif isinstance(batch, int) and not isinstance(batch, bool):
        batch_id, locked = batch, True
    else:
        raise PayloadError(f"batch= must be a cronbox.batch() (or its id), not {type(batch).__name__}")
    query = select(B.c.finished_at, B.c.cancelled_at).where(B.c.id == batch_id)
    row = connection.execute(query.with_for_update() if locked else query).first()
    if row is None:
        raise PayloadError(f"no batch {batch_id}")
    if row.cancelled_at is not None:
        raise PayloadError(f"batch {batch_id} is cancelled: it takes no new member")
    if row.finished_at is not None:
        raise PayloadError(f"batch {batch_id} is finished: it takes no new member")
    return batch_id


def _count(session: Session, batch_id: int, *, done: int = 0, failed: int = 0, cancelled: int = 0) -> None:
    """Raise the batch's counters: ONE UPDATE, which takes the batch row's lock (see the module's docstring)."""
    session.execute(update(B).where(B.c.id == batch_id).values(
        done=B.c.done + done, failed=B.c.failed + failed, cancelled=B.c.cancelled + cancelled))


def _settle(session: Session, batch_id: int, now: datetime) -> bool:
    """Under the batch lock (_count first): if no member is pending and the batch is not finished,
    finish it and dispatch its callbacks, in this transaction. True if this one did."""
    pending = exists().where(J.c.batch_id == batch_id, J.c.status.in_((READY, RESERVED)))
    row = session.execute(select(B.c.name, B.c.callbacks, B.c.payload, B.c.failed, B.c.allow_failures,
                                 B.c.cancelled_at, B.c.finished_at, pending.label("pending"))
                          .where(B.c.id == batch_id)).first()
    if row is None or row.finished_at is not None or row.pending:
        return False
    session.execute(update(B).where(B.c.id == batch_id, B.c.finished_at.is_(None)).values(finished_at=now))
    callbacks = json.loads(row.callbacks)
    roles = [FINALLY]
    if row.cancelled_at is None and (row.failed == 0 or row.allow_failures):
        roles.insert(0, THEN)
    _callbacks(session, batch_id, row.name, callbacks, roles, row.payload, now)
    return True


def _callback_rows(connection: Connection, batch_id: int, name: str, callbacks: dict, roles: list[str], payload: str,
                   now: datetime) -> list[dict]:
    roles = [role for role in roles if role in callbacks]
    sealer = sealer_for(sealed=True, what=f"batch {batch_id}'s callbacks") if callbacks.get(SEALED) and roles else None
    return [_job_row(callbacks[role], payload, now, connection=connection, sealer=sealer,
                     flow=json.dumps({"callback": role, "batch": batch_id, "name": name})) for role in roles]


def _callbacks(session: Session, batch_id: int, name: str, callbacks: dict, roles: list[str], payload: str,
               now: datetime) -> None:
    rows = _callback_rows(session.connection(), batch_id, name, callbacks, roles, payload, now)
    if rows:
        session.execute(_INSERT_JOB, rows)


def _cancel_ready(session: Session, batch_id: int, now: datetime, why: str) -> int:
    """The batch's members not started yet, failed as cancelled. At READ COMMITTED this UPDATE locks
    each ready row and re-reads it: one a claim took meanwhile is reserved, and left to run."""
    return session.execute(update(J).where(J.c.batch_id == batch_id, J.c.status == READY).values(
        status=FAILED, available_at=None, claim_token=None, unique_key=None, finished_at=now,
        last_error=why[:ERROR_MAX], error_class=CANCELLED_CLASS)).rowcount


def cancel(session: Transactional, batch_id: int, now: datetime) -> int:
    """Cancel a batch: its members not started yet never start (failed as cancelled); those running
    finish, and the last of them dispatches `finally` (`then` never runs). Returns how many were stopped."""
    s = _session_like(session)
    if s.execute(update(B).where(B.c.id == batch_id, B.c.cancelled_at.is_(None), B.c.finished_at.is_(None))
                 .values(cancelled_at=now)).rowcount != 1:  # the batch lock, taken first
        return 0
    stopped = _cancel_ready(s, batch_id, now, f"cancelled: batch {batch_id} was cancelled")
    _count(s, batch_id, cancelled=stopped)
    _settle(s, batch_id, now)
    return stopped


def cancel_running(session: Session, batch_id: int, now: datetime) -> tuple[int | None, Progress | None]:
    """An operator's cancel (`queue batch ID --cancel`, the console's batch page): (how many members
    not started were stopped, or None when the batch was not running: unknown, finished or cancelled
    already; its progress after)."""
    before = progress(session, batch_id)
    if before is None or before.state != "running":
        return None, before
    stopped = cancel(session, batch_id, now)
    return stopped, progress(session, batch_id)


def on_done(session: Session, items: list, values: dict[int, str], now: datetime, keep: float) -> None:
    """Jobs this transaction made done (each by its token-guarded ack): their results stored, the
    next step of their chains dispatched, their batches counted and settled (in batch id order)."""
    stored = results.seal(session, items, values)  # a sealed job's result sealed; the next step gets it opened
    results.insert_results(session, [(item.id, item.batch_id, stored[item.id]) for item in items
                                     if item.id in stored], now, keep)
    per_batch: dict[int, int] = {}
    for item in items:
        if item.flow is not None:
            _next_step(session, item, values.get(item.id), now)
        if item.batch_id is not None:
            per_batch[item.batch_id] = per_batch.get(item.batch_id, 0) + 1
    for batch_id in sorted(per_batch):
        _count(session, batch_id, done=per_batch[batch_id])
        _settle(session, batch_id, now)


def on_failed(session: Session, item: Any, error: str, now: datetime) -> None:
    """A job this transaction failed for good: its chain's catch, or its batch's counter, first-failure
    catch (and, unless allow_failures, the cancel of the members not started), and settle."""
    if item.flow is not None:
        connection = session.connection()
        flow = _flow(connection, item)
        if "chain" in flow and flow.get("catch"):
            body = dump_payload({"chain": flow["chain"], "step": flow["step"], "job": item.handler,
                                 "job_id": item.id, "error": error})
            catch_id = session.execute(_INSERT_JOB, _job_row(flow["catch"], body, now, connection=connection,
                                                             sealer=_sealer_of_flow(item))).inserted_primary_key[0]
            _link(session, item, flow, "catch_job", catch_id)
    if item.batch_id is None:
        return
    batch_id = item.batch_id
    _count(session, batch_id, failed=1)
    first = session.execute(update(B).where(B.c.id == batch_id, B.c.failed_at.is_(None))
                            .values(failed_at=now)).rowcount == 1
    if first:
        row = session.execute(select(B.c.name, B.c.callbacks, B.c.payload, B.c.allow_failures, B.c.cancelled_at)
                              .where(B.c.id == batch_id)).one()
        _callbacks(session, batch_id, row.name, json.loads(row.callbacks), [CATCH], row.payload, now)
        if not row.allow_failures and row.cancelled_at is None:
            session.execute(update(B).where(B.c.id == batch_id).values(cancelled_at=now))
            stopped = _cancel_ready(session, batch_id, now, f"cancelled: member {item.id} of batch {batch_id} failed")
            if stopped:
                _count(session, batch_id, cancelled=stopped)
    _settle(session, batch_id, now)


def reopen(session: Session, ids: list[int]) -> None:
    """Failed (or cancelled) members made ready again by an operator's retry: their counts taken back,
    and their batch open again if it had finished; its callbacks then run again when these finish
    (a new round: each round's callbacks exactly once). Under the batch lock, in batch id order."""
    rows = session.execute(select(J.c.batch_id, J.c.error_class, func.count()).where(
        J.c.id.in_(ids), J.c.status == FAILED, J.c.batch_id.is_not(None)).group_by(J.c.batch_id, J.c.error_class)).all()
    back: dict[int, list[int]] = {}
    for batch_id, error_class, count in rows:
        counts = back.setdefault(batch_id, [0, 0])
        counts[1 if error_class == CANCELLED_CLASS else 0] += int(count)
    for batch_id in sorted(back):
        failed, cancelled = back[batch_id]
        session.execute(update(B).where(B.c.id == batch_id).values(
            failed=B.c.failed - failed, cancelled=B.c.cancelled - cancelled, finished_at=None, cancelled_at=None))
        session.execute(update(B).where(B.c.id == batch_id, B.c.failed == 0).values(failed_at=None))


# ---- chains -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Chain:
    """A chain dispatched by `cronbox.chain()`: its id (in each step's log line and its catch's
    payload) and its first step's job id."""
    id: str
    first_job_id: int

    def progress(self, session: Transactional) -> chains.ChainProgress:
        """Its ChainProgress (each step's state, the step it is on), read on `session`; PayloadError if its
        first step's job is gone (pruned: `cronbox.chain_progress` with a later step's job id still reads it)."""
        found = chains.chain_progress(session, self.first_job_id)
        if found is None:
            raise PayloadError(f"no chain with a first step job {self.first_job_id}")
        return found


def chain(session: Transactional, steps: Any, *, catch: Any = None) -> Chain:
    """Dispatch a chain in `session`'s transaction: the first of `steps` ((job_fn, payload) pairs) now,
    each next one by the transaction that makes the step before it done, with that step's result as
    its `ctx.previous`. A step that fails after its tries stops the chain and dispatches `catch` (a
    @job) with {"chain", "step", "job", "job_id", "error"}. A chain may end in a batch, and a batch's
    `then` start a chain: `cronbox.batch(ctx.session, ...)` / `cronbox.chain(ctx.session, ...)` in the
    handler. Raises PayloadError for a step that is not a (@job function, JSON payload) pair (a list
    inside the steps, the chain itself among them: a cycle), a payload that contains itself, or a
    step or `catch` on a queue forwarded to Celery. Returns the Chain."""
    if isinstance(steps, (str, bytes, dict)) or not hasattr(steps, "__iter__"):
        raise PayloadError("steps must be a list of (job_fn, payload) pairs")
    steps = list(steps)
    if not steps:
        raise PayloadError("a chain needs at least one step")
    specs, handlers = [], []
    for index, step in enumerate(steps):
        if not isinstance(step, tuple) or len(step) != 2:
            raise PayloadError(f"step {index} must be a (job_fn, payload) pair, not {type(step).__name__}"
                               + (" (a chain inside a chain, or the chain itself: a cycle)"
                                  if isinstance(step, list) else ""))
        job, payload = step
        spec, handler = _spec_and_handler(job, f"step {index}", "a chain step")
        specs.append(spec + [_dump(payload, f"step {index}'s payload")])
        handlers.append(handler)
    catch_spec, catch_handler = (_spec_and_handler(catch, "catch=", "a chain's catch= callback") if catch is not None
                                 else (None, None))
    chain_id = uuid.uuid4().hex
    now = clock.utcnow()
    flow = json.dumps({"chain": chain_id, "step": 0, "rest": specs[1:], "catch": catch_spec})
    connection = connection_of(session, Job)
    # A sealed step seals the chain whole: every step's row carries the later ones' payloads in its flow.
    sealer = sealer_for(sealed=_sealing_of(handlers + [catch_handler]), what=f"a chain with job {specs[0][0]}")
    job_id = connection.execute(_INSERT_JOB, _job_row(specs[0], specs[0][3], now, connection=connection,
                                                      sealer=sealer, flow=flow)) \
        .inserted_primary_key[0]  # type: ignore[index]
    return Chain(chain_id, job_id)


def _next_step(session: Session, item: Any, value: str | None, now: datetime) -> None:
    """The step after `item` (made done by this transaction), dispatched in it with `value` (the step's
    result, its JSON as the handler returned it) as its ctx.previous: its flow names the first step's job
    ("first") and is sealed with the row when the chain is; `item`'s flow records the new job's id
    ("next"), so the chain's rows link forward from its first job (outbox.queue.chains reads them)."""
    connection = session.connection()
    flow = _flow(connection, item)
    if "chain" not in flow or not flow["rest"]:
        return
    spec, rest = flow["rest"][0], flow["rest"][1:]
    following = json.dumps({"chain": flow["chain"], "step": flow["step"] + 1, "rest": rest, "catch": flow["catch"],
                            "first": flow.get("first", item.id),
                            "previous": load_payload(value) if value is not None else None})
    next_id = session.execute(_INSERT_JOB, _job_row(spec, spec[3], now, connection=connection,
                                                    sealer=_sealer_of_flow(item), flow=following)).inserted_primary_key[0]
    _link(session, item, flow, "next", next_id)


def _link(session: Session, item: Any, flow: dict, what: str, linked_id: int) -> None:
    """Record in a finished step's flow the job its outcome dispatched ("next": the next step; "catch_job":
    the chain's catch), sealed again under the step's own seal id when its flow is sealed (the flow carries
    the previous step's result). The step's row is its own outcome's, written by this transaction a
    statement ago under its claim token: nobody else writes it."""
    text = json.dumps({**flow, what: linked_id})
    sealer = _sealer_of_flow(item)
    if sealer is not None:
        text = sealer.seal_with(session.connection(), FLOWS, item.seal_id, item.handler, text)
    session.execute(update(J).where(J.c.id == item.id).values(flow=text))


# ---- what a handler sees (ctx.batch, ctx.previous) ----------------------------------------

def attach(ctx: Any, item: Any, runtime: Any = None) -> None:
    """Set ctx.batch (a member's batch, or a callback's) and ctx.previous (a chain step's previous result,
    from its flow, opened in memory when sealed)."""
    if item.batch_id is not None:
        ctx.batch = Batch(item.batch_id, member=True)
    if item.flow is not None:
        flow = _flow(ctx.connection, item, runtime)
        if "callback" in flow:
            ctx.batch = Batch(flow["batch"], flow.get("name"))
        ctx.previous = flow.get("previous")


# ---- read models: code, `queue batches` / `queue batch ID`, the console -------------------------

def _progress(session, rows) -> list[Progress]:
    ids = [row.id for row in rows]
    pending: dict[int, int] = {}
    if ids:
        pending = {batch_id: int(count) for batch_id, count in session.execute(
            select(J.c.batch_id, func.count()).where(J.c.batch_id.in_(ids), J.c.status.in_((READY, RESERVED)))
            .group_by(J.c.batch_id)).all()}
    return [Progress(row.id, row.name, row.done, row.failed, row.cancelled, pending.get(row.id, 0),
                     bool(row.allow_failures), row.created_at, row.failed_at, row.cancelled_at, row.finished_at)
            for row in rows]


PROGRESS_COLUMNS = (B.c.id, B.c.name, B.c.done, B.c.failed, B.c.cancelled, B.c.allow_failures, B.c.created_at,
                    B.c.failed_at, B.c.cancelled_at, B.c.finished_at)


def progress(session: Transactional, batch_id: int) -> Progress | None:
    s = _session_like(session)
    rows = s.execute(select(*PROGRESS_COLUMNS).where(B.c.id == batch_id)).all()
    found = _progress(s, rows)
    return found[0] if found else None


def page(session: Session, cursor: tuple | None = None, *, size: int = paging.PAGE_SIZE) -> paging.Page:
    """Batches, newest first (by id), one page: rows of (id, name, done, failed, cancelled, ...)."""
    return paging.page(session, select(*PROGRESS_COLUMNS), (B.c.id,), cursor, size=size)


def progress_of(session: Session, rows) -> list[Progress]:
    """The progress of a page of batch rows (their pending members counted in one statement)."""
    return _progress(session, rows)


MEMBER_KEY = (int,)  # a members page's cursor: the last job id shown
MEMBER_STATES = (READY, RESERVED, DONE, FAILED)


def members_page(session: Session, batch_id: int, cursor: tuple | None = None, *, status: str | None = None,
                 size: int = paging.PAGE_SIZE) -> paging.Page:
    """One page of a batch's members (of `status`), newest first: rows of (id, queue, handler, status,
    attempts, error_class, last_error, trace_id, finished_at), never payloads. The (batch_id, status)
    index, the job id after it: a page costs an index range however deep."""
    query = select(J.c.id, J.c.queue, J.c.handler, J.c.status, J.c.attempts, J.c.error_class, J.c.last_error,
                   J.c.trace_id, J.c.finished_at).where(J.c.batch_id == batch_id)
    if status is not None:
        query = query.where(J.c.status == status)
    return paging.page(session, query, (J.c.id,), cursor, size=size)


def failed_members(session: Session, batch_id: int) -> list[int]:
    """The ids of a batch's failed members (cancelled ones too: failed as BatchCancelled)."""
    return list(session.scalars(select(J.c.id).where(J.c.batch_id == batch_id, J.c.status == FAILED)))


def prune(session: Session, before: datetime, batch: int) -> int:
    """Finished batches older than `before` whose members are all gone (pruned or forgotten)."""
    member = exists().where(J.c.batch_id == B.c.id)
    ids = list(session.scalars(select(B.c.id).where(B.c.finished_at < before, ~member)
                               .order_by(B.c.finished_at).limit(batch)))
    if ids:
        session.execute(delete(B).where(B.c.id.in_(ids)))
    return len(ids)
