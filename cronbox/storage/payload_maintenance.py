"""Sealed payloads over many rows: re-seal under the active key after a rotation (`storage rewrap`),
and seal plaintext rows in place (`storage seal-payloads`, for an install that turned sealing on).

Both page through the rows that may still run (jobs ready, reserved or failed; events not fanned
out, or with a pending or dead delivery) by id, a batch per short transaction, and rewrite each row
with `UPDATE ... WHERE id = ? AND payload = <as read>`: a run killed anywhere leaves each row wholly
old or wholly new, a row changed meanwhile (a retry, a prune) is left alone, and the next run goes
on from what is left. Finished rows are not touched: retention deletes them as before. The command
holds its run lock and checks it between batches (`before_batch`). A rewrap re-seals a sealed chain
step's flow with its payload, and the sealed results not expired yet (kept CRONBOX_RESULT_TTL after
their job finished) the same way, so no key the old rows need is left behind.

Sealing in place seals what a sealed job's row carries beside its payload too: a waiting chain step's
`flow` holds the later steps' payloads and the previous step's result, and a plaintext flow would also
leave the steps it dispatches unsealed (a chain is sealed whole when its flow is: queue.batches); so a
step's flow is sealed with its payload, under the row's seal id, when the step's job or any job its flow
names is one sealed now. And the results not expired of those jobs (readable by `result()` and a batch's
`then` for CRONBOX_RESULT_TTL) are sealed, bound to their job id, as a sealed job's result is written.

Unique keys. A unique job dispatched without a unique_key holds a default one derived from its payload
(queue.jobs.default_unique_key): a bare SHA-256 when plain, a keyed fingerprint when sealed, under the
active master key. Both commands re-key it in the same guarded UPDATE as the payload: sealing in place
replaces a bare hash (a phone number's is found by trying every number) with the fingerprint, and a
rewrap replaces the old key's fingerprint (or a bare hash an earlier seal-payloads left) with the active
key's; otherwise a sealed dispatch of the same payload computes a key no waiting row holds, and the job
runs twice. A default key is told from one the caller gave by recomputing it from the row's payload;
any other key is left as it is. The new key is written with `unique_key = <as read>` in the guard (a job
that finished meanwhile keeps no key), in a SAVEPOINT: a dispatch that takes the new key meanwhile makes
the row a failure of this run, left as it was, and the next run resolves it as below.

When another waiting or running job already holds the new key, the two are the same job with the same
payload, both admitted only because their keys differed. One is stopped, never deleted: the later
dispatched of the two (higher id: the one dispatch would have refused), else the other, if it is ready and
in no batch or chain, is failed as a duplicate (error class DuplicateJob, jobstore.fail_duplicate), its
payload sealed all the same, listed by `queue failed` and runnable with `queue retry`; the other keeps or
takes the key. When neither can be stopped (running, or a batch member whose failure would fail its
batch), both run, as they would have, and the row being sealed loses its default key (the other holds the
new one). Each case is reported (`ResealResult.duplicates`) and printed by the command.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from sqlalchemy import Select, and_, literal, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.payload import payload_bytes
from cronbox.outbox.core import clock
from cronbox.outbox.core.sealing import EVENTS, FLOWS, JOBS, PREFIX, RESULTS, SealError, Sealer, envelope_parts, \
    is_sealed, result_seal_id
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.events.models import Delivery, OutboxEvent
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.jobs import default_unique_key
from cronbox.outbox.queue.models import READY, Job, JobResult

BATCH = 200


@dataclass
class ResealResult:
    done: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # ("job 7", why)
    rekeyed: int = 0  # default unique keys replaced by the keyed one (the module's docstring)
    stopped: int = 0  # jobs failed as duplicates (DuplicateJob)
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # ("job 7", what was done)

    def add(self, other: ResealResult) -> None:
        self.done += other.done
        self.failed += other.failed
        self.rekeyed += other.rekeyed
        self.stopped += other.stopped
        self.duplicates += other.duplicates


def _waiting(table: str):
    if table == JOBS:
        return Job.status.in_(("ready", "reserved", "failed"))
    return or_(OutboxEvent.fanned_out_at.is_(None),
               OutboxEvent.id.in_(select(Delivery.event_id).where(Delivery.status.in_(("pending", "dead")))))


def _model(table: str):
    return Job if table == JOBS else OutboxEvent


def _run(sessions, sealer: Sealer, table: str, where: tuple, change: Callable, *, batch_size: int,
         before_batch: Callable[[], None], progress: Callable[[ResealResult], None], command: str,
         key_ttl: float) -> ResealResult:
    model = _model(table)
    name_column = Job.handler if table == JOBS else OutboxEvent.type
    if table == JOBS:
        extra = (Job.flow, Job.unique_key, Job.status, Job.batch_id)
    else:
        extra = tuple(literal(None).label(label) for label in ("flow", "unique_key", "status", "batch_id"))
    result = ResealResult()
    after = 0
    while True:
        before_batch()

        def work(session) -> tuple[int, ResealResult]:
            part = ResealResult()  # counted once the batch commits: in_transaction may run this again
            rows = session.execute(select(model.id, name_column, model.seal_id, model.payload, *extra)
                                   .where(model.id > after, _waiting(table), *where)
                                   .order_by(model.id).limit(batch_size)).all()
            connection = session.connection()
            for row in rows:
                try:
                    values = change(connection, row)
                except SealError as exc:
                    part.failed.append((f"{'job' if table == JOBS else 'event'} {row.id}", str(exc)))
                    continue
                if not values:
                    continue
                sealed = "payload" in values  # else only a default unique key to re-key
                if sealed:
                    values["payload_bytes"] = payload_bytes(values["payload"])
                # As read: a row changed meanwhile (a retry, a prune, a chain step's outcome linking
                # its next job in its flow) is left alone.
                unchanged = [model.id == row.id, model.payload == row.payload]
                if table == JOBS:
                    unchanged.append(Job.flow.is_(None) if row.flow is None else Job.flow == row.flow)
                if "unique_key" in values:
                    count = _rekey(session, row, values, unchanged, part, command=command, key_ttl=key_ttl)
                else:
                    count = session.execute(update(model).where(*unchanged).values(**values)
                                            .execution_options(synchronize_session=False)).rowcount
                if sealed:
                    part.done += count
            return (rows[-1].id if rows else 0), part

        last, part = in_transaction(sessions, work)
        if not last:
            break
        after = last
        result.add(part)
        crash_point("reseal-batch")
        progress(result)
    return result


def _rekey(session, row, values: dict, unchanged: list, result: ResealResult, *, command: str,
           key_ttl: float) -> int:
    """The guarded UPDATE of a job row whose default unique key is re-keyed (`values["unique_key"]`), and
    the duplicate it may turn out to be (the module's docstring). Rows written: 1, or 0 when it changed
    meanwhile (left as it is: the next run reads it again)."""
    new_key = values["unique_key"]
    guard = [*unchanged, Job.unique_key == row.unique_key]  # a job that finished meanwhile keeps no key
    holder = session.execute(select(Job.id, Job.status, Job.batch_id, Job.flow)
                             .where(Job.unique_key == new_key, Job.id != row.id)).first()
    if holder is None:
        try:
            with session.begin_nested():
                count = session.execute(update(Job).where(*guard).values(**values)
                                        .execution_options(synchronize_session=False)).rowcount
        except IntegrityError:
            result.failed.append((f"job {row.id}", "a dispatch took its new unique key meanwhile: left as it was; "
                                                   "run the command again"))
            return 0
        result.rekeyed += count
        return count
    now = clock.utcnow()
    later, earlier = (row, holder) if row.id > holder.id else (holder, row)
    for stop, keep in ((later, earlier), (earlier, later)):
        if stop.status != READY or stop.batch_id is not None or stop.flow is not None:
            continue  # running, or a batch member or chain step: its failure would fail its batch or chain
        why = (f"a duplicate of job {keep.id} (the same job and payload, waiting or running), found when "
               f"`storage {command}` re-keyed their unique key; `queue retry {stop.id}` runs it anyway")
        if stop is row:  # sealed all the same: its payload leaves plaintext with it
            count = int(jobstore.fail_duplicate(session, row.id, keep.id, now, why, key_ttl=key_ttl,
                                                unique_key=row.unique_key, guard=unchanged,
                                                values={k: v for k, v in values.items() if k != "unique_key"}))
        else:
            with session.begin_nested() as savepoint:
                if not jobstore.fail_duplicate(session, holder.id, row.id, now, why, key_ttl=key_ttl,
                                               unique_key=new_key):
                    continue  # claimed meanwhile: this row may be stopped instead
                count = session.execute(update(Job).where(*guard).values(**values)
                                        .execution_options(synchronize_session=False)).rowcount
                if not count:
                    savepoint.rollback()  # this row changed meanwhile: the other one stays as it was
                    return 0
            result.rekeyed += 1
        if count:
            result.stopped += 1
            result.duplicates.append((f"job {stop.id}", f"a duplicate of job {keep.id}: failed as "
                                      f"{jobstore.DUPLICATE_CLASS} (`queue retry {stop.id}` runs it anyway)"))
        return count
    count = session.execute(update(Job).where(*guard).values(**{**values, "unique_key": None})
                            .execution_options(synchronize_session=False)).rowcount
    if count:
        result.duplicates.append((f"job {row.id}", f"a duplicate of job {holder.id}; neither can be stopped "
                                  f"(running, or in a batch): both run, job {row.id} without its unique key"))
    return count


def rewrap(sessions, sealer: Sealer, *, batch_size: int = BATCH, before_batch: Callable[[], None] = lambda: None,
           progress: Callable[[ResealResult], None] = lambda r: None,
           key_ttl: float = jobstore.IDEMPOTENCY_TTL_DEFAULT) -> ResealResult:
    """Re-seal the waiting sealed payloads not under the active master key (events, then jobs), and re-key
    a unique job's default key: the fingerprint is keyed by the master key too, so after `storage new-key`
    a sealed dispatch of the same payload would miss the waiting job (the module's docstring: and what
    happens when a job dispatched since holds the new key). `key_ttl`: CRONBOX_IDEMPOTENCY_TTL, kept by
    a job failed as a duplicate."""
    active_id = sealer.keys.active()[0]
    total = ResealResult()
    for table in (EVENTS, JOBS):
        model = _model(table)
        where = (model.seal_id.is_not(None), ~model.payload.startswith(f"{PREFIX}{active_id}:", autoescape=True))

        def change(connection, row, table=table):
            if row.unique_key is None:
                envelope = sealer.reseal(connection, table, row[1], row.seal_id, row.payload)
                if envelope is None:
                    return None
                values = {"payload": envelope}
            else:  # opened once: its default key is recomputed from the text
                body = sealer.open(connection, table, row[1], row.seal_id, row.payload) if is_sealed(row.payload) \
                    else row.payload
                values = {"payload": sealer.seal_with(connection, table, row.seal_id, row[1], body)}
                # The fingerprint under the key it was sealed with, or a bare hash an earlier seal-payloads left.
                old_key = envelope_parts(row.payload)[0] if is_sealed(row.payload) else None
                if row.unique_key in (default_unique_key(row[1], body, None),
                                      *((default_unique_key(row[1], body, sealer, old_key),) if old_key else ())):
                    values["unique_key"] = default_unique_key(row[1], body, sealer)
            if is_sealed(row.flow):
                values["flow"] = sealer.reseal(connection, FLOWS, row[1], row.seal_id, row.flow)
            return values

        total.add(_run(sessions, sealer, table, where, change, batch_size=batch_size, before_batch=before_batch,
                       progress=progress, command="rewrap", key_ttl=key_ttl))
    total.add(_rewrap_results(sessions, sealer, active_id, batch_size=batch_size, before_batch=before_batch,
                              progress=progress))
    return total


def _rewrap_results(sessions, sealer: Sealer, active_id: str, *, batch_size: int, before_batch: Callable[[], None],
                    progress: Callable[[ResealResult], None]) -> ResealResult:
    """The sealed results not expired and not under the active key, re-sealed (by job id, as `_run`)."""
    R = JobResult

    def rows(after: int):
        return select(R.job_id, R.value).where(
            R.job_id > after, R.expires_at > clock.utcnow(), R.value.startswith(PREFIX, autoescape=True),
            ~R.value.startswith(f"{PREFIX}{active_id}:", autoescape=True))

    return _rewrite_results(sessions, rows, lambda connection, row: sealer.reseal(
        connection, RESULTS, "", result_seal_id(row.job_id), row.value), batch_size=batch_size,
        before_batch=before_batch, progress=progress)


def _rewrite_results(sessions, rows: Callable[[int], Select], change: Callable[[Connection, Any], str | None], *,
                     batch_size: int, before_batch: Callable[[], None],
                     progress: Callable[[ResealResult], None]) -> ResealResult:
    """Kept results rewritten in place, `rows(after)`'s next batch by job id per short transaction (as
    `_run`): `change` gives a row's new value (None: left as it is), written guarded by the value as read."""
    R = JobResult
    result = ResealResult()
    after = 0
    while True:
        before_batch()

        def work(session) -> tuple[int, ResealResult]:
            part = ResealResult()  # counted once the batch commits, as in `_run`: in_transaction may run this again
            batch = session.execute(rows(after).order_by(R.job_id).limit(batch_size)).all()
            connection = session.connection()
            for row in batch:
                try:
                    value = change(connection, row)
                except SealError as exc:
                    part.failed.append((f"result of job {row.job_id}", str(exc)))
                    continue
                if value is not None:
                    part.done += session.execute(update(R).where(R.job_id == row.job_id, R.value == row.value)
                                                 .values(value=value)
                                                 .execution_options(synchronize_session=False)).rowcount
            return (batch[-1].job_id if batch else 0), part

        last, part = in_transaction(sessions, work)
        if not last:
            break
        after = last
        result.add(part)
        crash_point("reseal-batch")
        progress(result)
    return result


def seal_plaintext(sessions, sealer: Sealer, *, jobs: set[str] | None, event_types: set[str] | None,
                   batch_size: int = BATCH, before_batch: Callable[[], None] = lambda: None,
                   progress: Callable[[ResealResult], None] = lambda r: None,
                   key_ttl: float = jobstore.IDEMPOTENCY_TTL_DEFAULT) -> ResealResult:
    """Seal in place the waiting plaintext payloads of these job handlers and event types (None: every one),
    a chain step's plaintext flow with its payload, and the plaintext results not expired of these jobs.
    A unique job's default key, a bare hash of its payload, is re-keyed to the keyed fingerprint a sealed
    dispatch computes (also on a row an earlier seal-payloads sealed without it); a job that turns out a
    duplicate of one already waiting is failed as DuplicateJob (the module's docstring). `key_ttl`:
    CRONBOX_IDEMPOTENCY_TTL, kept by a job failed as a duplicate."""
    total = ResealResult()
    for table, names in ((EVENTS, event_types), (JOBS, jobs)):
        if names is not None and not names:
            continue
        if table == JOBS:
            # A row not sealed, or a row whose flow is not: sealed by an earlier seal-payloads that left it;
            # or a sealed row with a unique key, which may be a bare hash such a run left (opened to check).
            plain_flow = and_(Job.flow.is_not(None), ~Job.flow.startswith(PREFIX, autoescape=True))
            where: tuple = (or_(Job.seal_id.is_(None), plain_flow, Job.unique_key.is_not(None)),)
            if names is not None:  # the flow of a step of another job may name a sealed one: read below
                where += (or_(Job.handler.in_(sorted(names)), plain_flow),)
        else:
            where = (OutboxEvent.seal_id.is_(None),) + ((OutboxEvent.type.in_(sorted(names)),)
                                                        if names is not None else ())

        def change(connection, row, table=table, names=names):
            flow = row.flow if row.flow is not None and not is_sealed(row.flow) else None
            if names is not None and row[1] not in names and not (flow is not None and _flow_jobs(flow) & names):
                return None
            body: str | None = None
            if row.seal_id is None:
                if is_sealed(row.payload):
                    return None  # an envelope without its seal id: nothing here can open it, nor seal it again
                body = row.payload
                payload, seal_id = sealer.seal(connection, table, row[1], row.payload)
            else:
                payload, seal_id = row.payload, row.seal_id
            values = {"payload": payload, "seal_id": seal_id} if body is not None or flow is not None else {}
            if flow is not None:
                values["flow"] = sealer.seal_with(connection, FLOWS, seal_id, row[1], flow)
            if row.unique_key is not None:
                if body is None:  # sealed already: its key is checked on its text, in memory
                    try:
                        body = sealer.open(connection, table, row[1], row.seal_id, row.payload)
                    except SealError:  # not this command's to report: health and its worker name it
                        body = None
                if body is not None and row.unique_key == default_unique_key(row[1], body, None):
                    values["unique_key"] = default_unique_key(row[1], body, sealer)
            return values or None

        total.add(_run(sessions, sealer, table, where, change, batch_size=batch_size, before_batch=before_batch,
                       progress=progress, command="seal-payloads", key_ttl=key_ttl))
    if jobs is None or jobs:
        total.add(_seal_results(sessions, sealer, jobs, batch_size=batch_size, before_batch=before_batch,
                                progress=progress))
    return total


def _flow_jobs(flow: str) -> set[str]:
    """The jobs a chain step's flow names: its later steps and its catch ([name, queue, ...] each)."""
    try:
        value = json.loads(flow)
    except ValueError:
        return set()
    if not isinstance(value, dict):
        return set()
    specs = list(value.get("rest") or []) + [value.get("catch")]
    return {spec[0] for spec in specs if isinstance(spec, list) and spec and isinstance(spec[0], str)}


def _seal_results(sessions, sealer: Sealer, jobs: set[str] | None, *, batch_size: int,
                  before_batch: Callable[[], None], progress: Callable[[ResealResult], None]) -> ResealResult:
    """The plaintext results not expired of these jobs (None: of every job, its row kept or pruned) sealed
    in place, bound to their job id as a sealed job's ack seals them (by job id, as `_run`)."""
    R = JobResult

    def rows(after: int):
        query = select(R.job_id, R.value).where(R.job_id > after, R.expires_at > clock.utcnow(),
                                                 ~R.value.startswith(PREFIX, autoescape=True))
        if jobs is not None:
            query = query.join(Job, Job.id == R.job_id).where(Job.handler.in_(sorted(jobs)))
        return query

    return _rewrite_results(sessions, rows, lambda connection, row: sealer.seal_with(
        connection, RESULTS, result_seal_id(row.job_id), "", row.value), batch_size=batch_size,
        before_batch=before_batch, progress=progress)
