"""cronbox's own short transactions, retried on lock conflicts and once on a lost connection."""
from __future__ import annotations

import logging
import random
import time
from typing import Callable, TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from cronbox.outbox.core.db_errors import error_code, is_deadlock, is_lock_conflict

log = logging.getLogger("cronbox")
T = TypeVar("T")


def in_transaction(sessions: sessionmaker[Session], work: Callable[[Session], T], *, retries: int = 5,
                   deadline: float | None = None, before_attempt: Callable[[], None] | None = None,
                   retry_waits: bool = True) -> T:
    """Run `work(session)` in one short transaction, retrying it on lock conflicts.

    Bounded: after `retries` conflicts the error propagates; with a `deadline` (time.monotonic), lock
    conflicts are retried while it has not passed instead, each logged (a run's writes: their waits
    are bounded by outbox.core.lock_wait, which `before_attempt` applies). `retry_waits=False`: a lock
    wait that timed out (1205, SQLite busy) is not waited again, only deadlocks are retried. `work` must
    be safe to run again, which holds for our claim/ack statements (guarded by status and claim token).
    """
    reconnected = False
    attempt = 0
    while True:
        if before_attempt is not None:
            before_attempt()
        started = time.monotonic()
        try:
            with sessions.begin() as session:
                return work(session)
        except DBAPIError as exc:
            if exc.connection_invalidated and not reconnected:
                # The connection was found dead (killed, server restarted): one more try on a
                # fresh one. Safe: our statements are guarded by status and claim token.
                reconnected = True
                log.warning("database connection lost (%s); retrying the transaction once", error_code(exc))
                continue
            if not isinstance(exc, OperationalError) or not is_lock_conflict(exc):
                raise
            if not retry_waits and not is_deadlock(exc):
                raise
            attempt += 1
            now = time.monotonic()
            if deadline is None:
                if attempt > retries:
                    raise
                log.info("lock conflict (%s), retrying transaction (%d/%d)", error_code(exc) or "busy",
                         attempt, retries)
            else:
                if now >= deadline:
                    raise
                log.warning("lock conflict (%s) after waiting %.1fs for a lock another transaction holds; "
                            "retrying for up to %.0fs more (the run's remaining time)",
                            error_code(exc) or "busy", now - started, deadline - now)
            time.sleep(random.uniform(0.005, 0.05) * min(attempt, 10))
