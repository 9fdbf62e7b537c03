"""Showing one event's or job's payload to a person: masked unless revealed, and a reveal is audited.

A sealed payload is shown as `sealed (N bytes, key K)` everywhere (outbox.core.sealing.describe).
Revealing its text is an explicit act (`queue show ID --reveal --reason ...`, `outbox show ID
--reveal ...`, the console's reveal button): the entry (who, why, which row) is written to the file
audit trail (cronbox_file_audit, action `reveal-payload`) in the transaction that read the row, so
the text is never shown without its entry committed first.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.sealing import EVENTS, JOBS, describe, is_sealed, open_payload
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.events.models import OutboxEvent
from cronbox.outbox.queue.models import Job

from . import audit

MAX_REASON = 200


@dataclass(frozen=True)
class ShownPayload:
    table: str
    id: int
    name: str  # the job's handler or the event's type
    status: str
    payload: str  # `sealed (N bytes, key K)`, `plaintext (N characters)`, or the text once revealed
    revealed: bool


def show(runtime, table: str, row_id: int, *, reveal: bool = False, actor: str = "cli", reason: str | None = None,
         client: audit.Client = audit.CLI) -> ShownPayload:
    """One row's payload as a person may see it. `reveal`: its text (opened when sealed), audited with
    `actor` and `reason` (required). CronboxError for no such row, a missing reason, or a payload that
    does not open (the failed attempt is audited too)."""
    if reveal and (not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON):
        raise CronboxError(f"revealing a payload needs --reason (1 to {MAX_REASON} characters): it is audited")
    model = Job if table == JOBS else OutboxEvent

    def work(session) -> ShownPayload:
        row = session.get(model, row_id)
        if row is None:
            raise CronboxError(f"no {'job' if table == JOBS else 'event'} {row_id}")
        name = row.handler if table == JOBS else row.type
        status = row.status if table == JOBS else ("fanned out" if row.fanned_out_at else "waiting")
        if not reveal:
            return ShownPayload(table, row_id, name, status, describe(row.payload), False)
        subject = f"{'job' if table == JOBS else 'event'}:{row_id}"
        try:
            value = open_payload(runtime, table, name, row.seal_id, row.payload, session.connection())
        except CronboxError as exc:
            audit.record(session, "reveal-payload", "refused", subject=subject, client=client,
                         detail=f"by {actor}: {reason} ({exc})")
            return ShownPayload(table, row_id, name, status, f"cannot open: {exc}", False)
        audit.record(session, "reveal-payload", "ok", subject=subject, client=client,
                     detail=f"by {actor}: {reason}" + ("" if is_sealed(row.payload) else " (plaintext)"))
        import json

        return ShownPayload(table, row_id, name, status, json.dumps(value, ensure_ascii=False, indent=2), True)

    return in_transaction(runtime.sessions, work)


def revealed_entries(session, subject: str) -> list:
    """The audit entries of reveals of one row (`job:7`, `event:3`), oldest first (tests, the console)."""
    from .models import AuditEntry

    return list(session.scalars(select(AuditEntry).where(AuditEntry.action == "reveal-payload",
                                                         AuditEntry.subject == subject).order_by(AuditEntry.id)))


__all__ = ["EVENTS", "JOBS", "ShownPayload", "show", "revealed_entries"]
