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
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from sqlalchemy import and_, literal, or_, select, update

from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.payload import payload_bytes
from cronbox.outbox.core import clock
from cronbox.outbox.core.sealing import EVENTS, FLOWS, JOBS, PREFIX, RESULTS, SealError, Sealer, is_sealed, \
    result_seal_id
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.events.models import Delivery, OutboxEvent
from cronbox.outbox.queue.models import Job, JobResult

BATCH = 200


@dataclass
class ResealResult:
    done: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # ("job 7", why)


def _waiting(table: str):
    if table == JOBS:
        return Job.status.in_(("ready", "reserved", "failed"))
    return or_(OutboxEvent.fanned_out_at.is_(None),
               OutboxEvent.id.in_(select(Delivery.event_id).where(Delivery.status.in_(("pending", "dead")))))


def _model(table: str):
    return Job if table == JOBS else OutboxEvent


def _run(sessions, sealer: Sealer, table: str, where: tuple, change: Callable, *, batch_size: int,
         before_batch: Callable[[], None], progress: Callable[[ResealResult], None]) -> ResealResult:
    model = _model(table)
    name_column = Job.handler if table == JOBS else OutboxEvent.type
    result = ResealResult()
    after = 0
    while True:
        before_batch()

        def work(session) -> int:
            nonlocal after
            flow = Job.flow if table == JOBS else literal(None).label("flow")
            rows = session.execute(select(model.id, name_column, model.seal_id, model.payload, flow)
                                   .where(model.id > after, _waiting(table), *where)
                                   .order_by(model.id).limit(batch_size)).all()
            connection = session.connection()
            for row in rows:
                try:
                    values = change(connection, row)
                except SealError as exc:
                    result.failed.append((f"{'job' if table == JOBS else 'event'} {row.id}", str(exc)))
                    continue
                if values is not None:
                    values["payload_bytes"] = payload_bytes(values["payload"])
                    # As read: a row changed meanwhile (a retry, a prune, a chain step's outcome linking
                    # its next job in its flow) is left alone.
                    unchanged = [model.payload == row.payload]
                    if table == JOBS:
                        unchanged.append(Job.flow.is_(None) if row.flow is None else Job.flow == row.flow)
                    result.done += session.execute(update(model).where(model.id == row.id, *unchanged)
                                                   .values(**values).execution_options(synchronize_session=False)
                                                   ).rowcount
            if rows:
                after = rows[-1].id
            return len(rows)

        if not in_transaction(sessions, work):
            break
        crash_point("reseal-batch")
        progress(result)
    return result


def rewrap(sessions, sealer: Sealer, *, batch_size: int = BATCH, before_batch: Callable[[], None] = lambda: None,
           progress: Callable[[ResealResult], None] = lambda r: None) -> ResealResult:
    """Re-seal the waiting sealed payloads not under the active master key (events, then jobs)."""
    active_id = sealer.keys.active()[0]
    total = ResealResult()
    for table in (EVENTS, JOBS):
        model = _model(table)
        where = (model.seal_id.is_not(None), ~model.payload.startswith(f"{PREFIX}{active_id}:", autoescape=True))

        def change(connection, row, table=table):
            envelope = sealer.reseal(connection, table, row[1], row.seal_id, row.payload)
            if envelope is None:
                return None
            if not is_sealed(row.flow):
                return {"payload": envelope}
            return {"payload": envelope, "flow": sealer.reseal(connection, FLOWS, row[1], row.seal_id, row.flow)}

        part = _run(sessions, sealer, table, where, change, batch_size=batch_size, before_batch=before_batch,
                    progress=progress)
        total.done += part.done
        total.failed += part.failed
    part = _rewrap_results(sessions, sealer, active_id, batch_size=batch_size, before_batch=before_batch,
                           progress=progress)
    total.done += part.done
    total.failed += part.failed
    return total


def _rewrap_results(sessions, sealer: Sealer, active_id: str, *, batch_size: int, before_batch: Callable[[], None],
                    progress: Callable[[ResealResult], None]) -> ResealResult:
    """The sealed results not expired and not under the active key, re-sealed (by job id, as `_run`)."""
    R = JobResult
    result = ResealResult()
    after = 0
    while True:
        before_batch()

        def work(session) -> int:
            nonlocal after
            rows = session.execute(select(R.job_id, R.value).where(
                R.job_id > after, R.expires_at > clock.utcnow(), R.value.startswith(PREFIX, autoescape=True),
                ~R.value.startswith(f"{PREFIX}{active_id}:", autoescape=True)).order_by(R.job_id).limit(batch_size)).all()
            connection = session.connection()
            for row in rows:
                try:
                    envelope = sealer.reseal(connection, RESULTS, "", result_seal_id(row.job_id), row.value)
                except SealError as exc:
                    result.failed.append((f"result of job {row.job_id}", str(exc)))
                    continue
                if envelope is not None:
                    result.done += session.execute(update(R).where(R.job_id == row.job_id, R.value == row.value)
                                                   .values(value=envelope)
                                                   .execution_options(synchronize_session=False)).rowcount
            if rows:
                after = rows[-1].job_id
            return len(rows)

        if not in_transaction(sessions, work):
            break
        crash_point("reseal-batch")
        progress(result)
    return result


def seal_plaintext(sessions, sealer: Sealer, *, jobs: set[str] | None, event_types: set[str] | None,
                   batch_size: int = BATCH, before_batch: Callable[[], None] = lambda: None,
                   progress: Callable[[ResealResult], None] = lambda r: None) -> ResealResult:
    """Seal in place the waiting plaintext payloads of these job handlers and event types (None: every one),
    a chain step's plaintext flow with its payload, and the plaintext results not expired of these jobs."""
    total = ResealResult()
    for table, names in ((EVENTS, event_types), (JOBS, jobs)):
        if names is not None and not names:
            continue
        if table == JOBS:
            # A row not sealed, or a row whose flow is not: sealed by an earlier seal-payloads that left it.
            plain_flow = and_(Job.flow.is_not(None), ~Job.flow.startswith(PREFIX, autoescape=True))
            where: tuple = (or_(Job.seal_id.is_(None), plain_flow),)
            if names is not None:  # the flow of a step of another job may name a sealed one: read below
                where += (or_(Job.handler.in_(sorted(names)), plain_flow),)
        else:
            where = (OutboxEvent.seal_id.is_(None),) + ((OutboxEvent.type.in_(sorted(names)),)
                                                        if names is not None else ())

        def change(connection, row, table=table, names=names):
            flow = row.flow if row.flow is not None and not is_sealed(row.flow) else None
            if names is not None and row[1] not in names and not (flow is not None and _flow_jobs(flow) & names):
                return None
            if row.seal_id is None:
                if is_sealed(row.payload):
                    return None  # an envelope without its seal id: nothing here can open it, nor seal it again
                payload, seal_id = sealer.seal(connection, table, row[1], row.payload)
            else:
                payload, seal_id = row.payload, row.seal_id
            values = {"payload": payload, "seal_id": seal_id}
            if flow is not None:
                values["flow"] = sealer.seal_with(connection, FLOWS, seal_id, row[1], flow)
            return values

        part = _run(sessions, sealer, table, where, change, batch_size=batch_size, before_batch=before_batch,
                    progress=progress)
        total.done += part.done
        total.failed += part.failed
    if jobs is None or jobs:
        part = _seal_results(sessions, sealer, jobs, batch_size=batch_size, before_batch=before_batch,
                             progress=progress)
        total.done += part.done
        total.failed += part.failed
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
    result = ResealResult()
    after = 0
    while True:
        before_batch()

        def work(session) -> int:
            nonlocal after
            query = select(R.job_id, R.value).where(R.job_id > after, R.expires_at > clock.utcnow(),
                                                     ~R.value.startswith(PREFIX, autoescape=True))
            if jobs is not None:
                query = query.join(Job, Job.id == R.job_id).where(Job.handler.in_(sorted(jobs)))
            rows = session.execute(query.order_by(R.job_id).limit(batch_size)).all()
            connection = session.connection()
            for row in rows:
                try:
                    envelope = sealer.seal_with(connection, RESULTS, result_seal_id(row.job_id), "", row.value)
                except SealError as exc:
                    result.failed.append((f"result of job {row.job_id}", str(exc)))
                    continue
                result.done += session.execute(update(R).where(R.job_id == row.job_id, R.value == row.value)
                                               .values(value=envelope)
                                               .execution_options(synchronize_session=False)).rowcount
            if rows:
                after = rows[-1].job_id
            return len(rows)

        if not in_transaction(sessions, work):
            break
        crash_point("reseal-batch")
        progress(result)
    return result
