"""What a test sees of the rows its code wrote: events with their deliveries, jobs; which of them match
an assertion, and the readable account of what was there when none (or one too many) did."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence, TypeVar

from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.payload import load_payload
from cronbox.outbox.core.sealing import EVENTS, JOBS, is_sealed

SHOWN_ROWS = 20  # rows listed in a failure message; more are counted
SHOWN_PAYLOAD = 300  # characters of a payload shown per row


class KitError(CronboxError):
    """cronbox.testing was used in a way that cannot give a true answer (an unmigrated database,
    jobs no handler here can run, a commit inline mode does not see...); the message says the fix."""


class DrainLoop(KitError):
    """deliver() or drain() ran as many handlers as its bound allows and work was still due: handlers
    that record or dispatch each other (or themselves) without end. The message names them."""


@dataclass(frozen=True)
class DeliveryRow:
    """One consumer's delivery of an event (cronbox_deliveries)."""

    id: int
    consumer: str
    status: str  # "pending" (new, retrying or leased), "done", "dead" or "skipped"
    attempts: int
    last_error: str | None
    next_attempt_at: datetime | None
    finished_at: datetime | None

    @property
    def retrying(self) -> bool:
        """Failed at least once and waiting for its next attempt (or leased by a run now). A RetryLater
        uses no attempt and records no error: a delivery it put off shows only its later next_attempt_at."""
        return self.status == "pending" and (self.attempts > 0 or self.last_error is not None)


@dataclass(frozen=True)
class EventRow:
    """An event the code recorded and committed (cronbox_events), with its deliveries once a relay
    (deliver(), tick(), inline mode) fanned it out to the consumers registered then."""

    id: int
    type: str
    key: str | None
    payload: Any
    created_at: datetime
    available_at: datetime
    deliveries: tuple[DeliveryRow, ...]

    def delivery(self, consumer: str) -> DeliveryRow:
        """The delivery to `consumer` (a consumer's name=); KitError when the event has none."""
        for delivery in self.deliveries:
            if delivery.consumer == consumer:
                return delivery
        names = ", ".join(d.consumer for d in self.deliveries) or "none yet (not delivered: call deliver())"
        raise KitError(f"event #{self.id} {self.type} has no delivery to {consumer!r}; its deliveries: {names}")


@dataclass(frozen=True)
class JobRow:
    """A job the code dispatched and committed (cronbox_jobs)."""

    id: int
    job: str  # the handler's name (`@job(name=...)`; cronbox.sms for send_sms)
    queue: str
    payload: Any
    status: str  # "ready" (waiting or retrying), "reserved" (running, or its run died), "done" or "failed"
    attempts: int
    last_error: str | None  # "ExceptionClass: message" of the last failure (or RetryLater's reason)
    error_class: str | None
    available_at: datetime | None  # when it is due (ready) or its lease ends (reserved)
    retry_until: datetime | None
    created_at: datetime
    reserved_at: datetime | None  # its last claim: None while no worker ever took it
    finished_at: datetime | None

    @property
    def retrying(self) -> bool:
        """Claimed before and waiting again: after a failure (its last_error says which), or put off by
        RetryLater, a rate limit or a channel pause (no attempt used, no error recorded)."""
        return self.status == "ready" and self.reserved_at is not None

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def _payload(opener: Callable | None, table: str, name: str, seal_id: str | None, text: str):
    """A row's payload as its handler gets it: a sealed one opened (in this test's memory) by `opener`."""
    return opener(table, name, seal_id, text) if opener is not None and is_sealed(text) else load_payload(text)


def event_rows(found: Sequence[tuple], opener: Callable | None = None) -> list[EventRow]:
    """deliveries.recorded()'s rows as EventRows, payloads decoded (sealed ones opened by `opener`)."""
    return [EventRow(e.id, e.type, e.key, _payload(opener, EVENTS, e.type, e.seal_id, e.payload), e.created_at,
                     e.available_at,
                     tuple(DeliveryRow(d.id, d.consumer, d.status, d.attempts, d.last_error, d.next_attempt_at,
                                       d.finished_at) for d in rows))
            for e, rows in found]


def job_rows(found: Sequence, opener: Callable | None = None) -> list[JobRow]:
    """jobstore.listed()'s rows as JobRows, payloads decoded (sealed ones opened by `opener`)."""
    return [JobRow(r.id, r.handler, r.queue, _payload(opener, JOBS, r.handler, r.seal_id, r.payload), r.status, r.attempts, r.last_error,
                   r.error_class, r.available_at, r.retry_until, r.created_at, r.reserved_at, r.finished_at)
            for r in found]


_MISSING = object()


def differences(payload: Any, expected: Mapping[str, Any]) -> list[str]:
    """How `payload` differs from the keys a test expects (each key equal to its value); [] when it
    matches. A payload that is not a JSON object matches only an empty expectation."""
    if not expected:
        return []
    if not isinstance(payload, dict):
        return [f"payload is {_short(payload)}, not an object"]
    found = []
    for name, value in expected.items():
        actual = payload.get(name, _MISSING)
        if actual is _MISSING:
            found.append(f"{name}: missing (expected {_short(value)})")
        elif actual != value:
            found.append(f"{name}: {_short(actual)} (expected {_short(value)})")
    return found


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def payload_text(payload: Any) -> str:
    text = json.dumps(payload, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= SHOWN_PAYLOAD else text[:SHOWN_PAYLOAD - 3] + "..."


def describe_event(row: EventRow) -> str:
    deliveries = ", ".join(f"{d.consumer} {d.status}" + (f" ({d.last_error})" if d.last_error else "")
                           for d in row.deliveries) or "not delivered yet"
    key = f" key={row.key}" if row.key is not None else ""
    return f"#{row.id} {row.type}{key} {payload_text(row.payload)} [{deliveries}]"


def describe_job(row: JobRow) -> str:
    state = f"{row.status}, attempts {row.attempts}" + (f", last error: {row.last_error}" if row.last_error else "")
    return f"#{row.id} {row.job} on {row.queue} ({state}) {payload_text(row.payload)}"


R = TypeVar("R", EventRow, JobRow)


def wanted(what: str, name: str | None, expected: Mapping[str, Any], where: str = "") -> str:
    """`event 'appointment.paid' with appointment_id=7`, for a failure's first line."""
    text = what + (f" {name!r}" if name is not None else "") + where
    if expected:
        text += " with " + ", ".join(f"{k}={_short(v)}" for k, v in expected.items())
    return text


def account(rows: Sequence[R], describe, why: dict[int, list[str]], plural: str) -> str:
    """The rows that were there, each with why it did not match (when it did not), at most SHOWN_ROWS."""
    if not rows:
        return f"no {plural} at all (committed ones only: an uncommitted or rolled-back transaction leaves none)"
    lines = [f"{plural} there ({len(rows)}):"]
    for row in rows[:SHOWN_ROWS]:
        lines.append("  " + describe(row))
        lines += [f"      {reason}" for reason in why.get(row.id, [])]
    if len(rows) > SHOWN_ROWS:
        lines.append(f"  ... and {len(rows) - SHOWN_ROWS} more")
    return "\n".join(lines)
