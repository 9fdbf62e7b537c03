"""Settle: a handler that succeeded has its ctx.session writes kept together with what records its
success, or neither. The one step for every place that does it: an item run alone (its ack:
outbox.engine.outcomes.Outcomes.ack_with), a member of a commit group (kept in its savepoint for the
group's COMMIT: outbox.engine.group_commit) and `amqp consume` (its inbox row: outbox.events.consume).

- a session the handler left failed (a database error it caught and did not roll back) keeps
  nothing: a failed attempt;
- `write(transaction)`, the caller's record of the success in the same transaction (the ack, the
  inbox row written again), may say the writes must not commit (the lease was lost, a copy was
  handled meanwhile): its outcome is returned instead, and the writes are rolled back;
- in a commit group, the writes are flushed and left in the handler's savepoint: the group's
  COMMIT ends it with the rest;
- alone, one COMMIT holds the writes and the record. A COMMIT that fails (a constraint, a conflict)
  is a failed attempt; one that waited for a lock until the run's time ran out names the wait
  (outbox.core.lock_wait). The error keeps the exception (`Outcome.raised`): a caller that must stop
  on a lost connection (`amqp consume`) tells it from there.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from sqlalchemy.exc import OperationalError

from cronbox.outbox.core.db_errors import is_lock_conflict
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.lock_wait import lock_wait_error
from cronbox.outbox.core.text import describe
from cronbox.outbox.engine.context import Context, HandlerTransaction
from cronbox.outbox.engine.handler_call import ERROR, Outcome

log = logging.getLogger("cronbox")

LEFT_FAILED = "the handler left ctx.session failed (call rollback() after catching a database error): "


def settle(ctx: Context, outcome: Outcome, write: Callable[[HandlerTransaction], Outcome | None] | None = None, *,
           step: str = "ack", who: str = "") -> Outcome:
    """Keep the writes of a handler that succeeded (`outcome`, its work begun on the connection) with
    `write`'s record, in one COMMIT (crash point `before-<step>-commit`); the outcome to go on with:
    `outcome` once they are kept, else a failed attempt's or `write`'s. `who`: the item's ids, for
    the line a lock wait logs."""
    transaction = ctx.transaction
    assert transaction is not None  # only for a handler whose work began
    failed_with = transaction.session.failed_with
    if failed_with is not None:
        return Outcome(ERROR, outcome.seconds, LEFT_FAILED + failed_with)
    grouped = transaction.commit_group is not None
    waiting_since = time.monotonic()
    try:
        if grouped:
            transaction.keep()
            return outcome
        if write is not None:
            instead = write(transaction)
            if instead is not None:
                ctx.discard_session()
                return instead
        crash_point(f"before-{step}-commit")
        transaction.commit()
    except Exception as exc:
        if not grouped:  # a group's member is rolled back to its savepoint by the group
            ctx.discard_session(invalidate=True)
        if isinstance(exc, OperationalError) and is_lock_conflict(exc):
            error = lock_wait_error(f"the {step}", time.monotonic() - waiting_since)
            if who:
                log.warning("%s: %s", who, error)
            return Outcome(ERROR, outcome.seconds, error, raised=exc)
        return Outcome(ERROR, outcome.seconds, f"commit failed: {describe(exc, 950)}", raised=exc)
    return outcome
