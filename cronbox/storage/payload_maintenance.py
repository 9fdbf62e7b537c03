"""Sealed payloads over many rows: re-seal under the active key after a rotation (`storage rewrap`),
and seal plaintext rows in place (`storage seal-payloads`, for an install that turned sealing on).

Both page through the rows that may still run (jobs ready, reserved or failed; events not fanned
out, or with a pending or dead delivery) by id, a batch per short transaction, and rewrite each row
with `UPDATE ... WHERE id = ? AND payload = <as read>`: a run killed anywhere leaves each row wholly
old or wholly new, a row changed meanwhile (a retry, a prune) is left alone, and the next run goes
on from what is left. Finished rows are not touched: retention deletes them as before. The command
holds its run lock and checks it between batches (`before_batch`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from sqlalchemy import or_, select, update

from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.payload import payload_bytes
from cronbox.outbox.core.sealing import EVENTS, JOBS, PREFIX, SealError, Sealer, is_sealed
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.events.models import Delivery, OutboxEvent
from cronbox.outbox.queue.models import Job

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
            rows = session.execute(select(model.id, name_column, model.seal_id, model.payload)
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
            return None if envelope is None else {"payload": envelope}

        part = _run(sessions, sealer, table, where, change, batch_size=batch_size, before_batch=before_batch,
                    progress=progress)
        total.done += part.done
        total.failed += part.failed
    return total


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
