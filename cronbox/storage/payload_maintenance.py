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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from sqlalchemy import literal, or_, select, update

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
                    result.done += session.execute(update(model).where(model.id == row.id, model.payload == row.payload)
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
    """Seal in place the waiting plaintext payloads of these job handlers and event types (None: every one)."""
    total = ResealResult()
    for table, names in ((EVENTS, event_types), (JOBS, jobs)):
        if names is not None and not names:
            continue
        model = _model(table)
        name_column = Job.handler if table == JOBS else OutboxEvent.type
        where = (model.seal_id.is_(None),) + ((name_column.in_(sorted(names)),) if names is not None else ())

        def change(connection, row, table=table):
            if is_sealed(row.payload):
                return None
            envelope, seal_id = sealer.seal(connection, table, row[1], row.payload)
            return {"payload": envelope, "seal_id": seal_id}

        part = _run(sessions, sealer, table, where, change, batch_size=batch_size, before_batch=before_batch,
                    progress=progress)
        total.done += part.done
        total.failed += part.failed
    return total
