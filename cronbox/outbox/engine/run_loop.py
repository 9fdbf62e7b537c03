"""The loop every cron-started run shares: stages in order, budget, lock checks, linger.

A stage is a callable(budget) -> units of work done (relay, queue drain, scheduler...).
The loop repeats the stages until a round does nothing; then, when lingering,
it polls about once a second until --max-time, so a per-minute cron line gives
second-level latency; on PostgreSQL a `listener` (outbox.core.notify) ends the wait as soon as new
work commits, so latency is milliseconds there, polling still catching what no notification told. The database going away (gone away, lost connection, too
many connections) is logged, waited out and retried until --max-time: nothing
claimed is lost, because leases expire and acks are token-checked. A run whose time is up while it
waits the database out ends as "lost-connection", whichever check finds the time up: the wait
itself, or the loop's own check after it (which keeps the time headroom and the expected handler
time free, so it can stop a run a wait left a second to).
"""
from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

from sqlalchemy.exc import DBAPIError, OperationalError

from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import CONNECTION_ERRORS, is_connection_lost, is_lock_conflict
from cronbox.outbox.core.errors import LockLost
from cronbox.outbox.core.lock_wait import run_lock_waits
from cronbox.outbox.core.locks import RunLock
from cronbox.outbox.core.notify import Listener
from cronbox.outbox.core.text import describe
from cronbox.outbox.engine import heartbeat
from cronbox.outbox.engine.budget import Budget

log = logging.getLogger("cronbox")

POLL_SECONDS = 1.0
RECONNECT_PAUSE = 3.0


@dataclass
class RunResult:
    stop_reason: str
    exit_code: int = 0
    error: str | None = None
    extra: dict = field(default_factory=dict)


class StopSignals:
    """SIGTERM/SIGINT ask the run to stop after the current handler (the host or the operator
    wants us gone; finishing one handler is better than abandoning it mid-way)."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self.previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self.previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: the caller handles signals
                pass
        return self

    def _handle(self, signum, frame):
        self.budget.stop("signal")
        log.info("received %s; finishing the current handler, then stopping", signal.Signals(signum).name)

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def run_loop(stages: list[Callable[[Budget], int]], budget: Budget, *, linger: bool,
             lock: RunLock | None = None, poll: float = POLL_SECONDS, listener: Listener | None = None) -> RunResult:
    result = RunResult(stop_reason="empty")
    database_away = False  # the last round ended on a lost connection, and none has got through since
    if listener is not None and linger:
        listener.listen()  # before the first look for work: what commits after it wakes the wait
    else:
        listener = None
    with StopSignals(budget):
        while True:
            reason = budget.stop_reason()
            if reason:
                result = _database_unreachable() if database_away else RunResult(stop_reason=reason)
                break
            try:
                if lock is not None:
                    lock.check()
                work = 0
                for stage in stages:
                    work += stage(budget)
                database_away = False
            except LockLost as exc:
                result.stop_reason, result.exit_code, result.error = "lock-lost", 1, str(exc)
                break
            except CONNECTION_ERRORS as exc:
                # One clause for both kinds: a lost connection is an OperationalError too, and a
                # separate `except OperationalError` re-raising it would skip the reconnect below.
                # (A PendingRollbackError's Connection was closed by the stage's `with engine.connect()`.)
                if is_lock_conflict(exc):
                    # What the stage had claimed runs again when its lease expires.
                    result = stopped_by_lock_wait(stage_name(stage), exc)
                    break
                if not is_connection_lost(exc):
                    raise
                cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
                log.warning("database connection lost (%s); pausing %.0fs, then reconnecting",
                            describe(cause)[:200], RECONNECT_PAUSE)
                database_away = True
                if not _pause(budget, RECONNECT_PAUSE):
                    result = _database_unreachable()
                    break
                continue
            if work:
                continue
            if not linger or not _pause(budget, poll, listener):
                result.stop_reason = budget.stop_reason() or ("empty" if not linger else "max-time")
                break
    return result


def _database_unreachable() -> RunResult:
    return RunResult(stop_reason="lost-connection", exit_code=1, error="database unreachable until the end of the run")


def stopped_by_lock_wait(what: str, exc: OperationalError) -> RunResult:
    """A run whose statement (`what` sent it) still waited for a lock another transaction holds when
    the run's time was up (every wait is bounded by it: outbox.core.lock_wait): it stops as it would
    at --max-time, exit 0, with one line saying so, not with a traceback."""
    log.warning("stopping the run: %s waited for a lock another transaction holds until the run's time ran out "
                "(%s)", what, describe(exc.orig or exc)[:200])
    return RunResult(stop_reason="lock-wait")


def start_within(engine, budget: Budget, start: Callable[[], None], what: str) -> RunResult | None:
    """Run a command's first step (its schema check) with its lock waits bounded by the run's time,
    as the run's own are: on SQLite even a read begins with the write lock (BEGIN IMMEDIATE), which
    another process's write transaction holds. Returns the run's "lock-wait" stop if it waited past
    that time, else None."""
    with run_lock_waits(engine, budget.remaining):
        try:
            start()
        except OperationalError as exc:
            if not is_lock_conflict(exc):
                raise
            return stopped_by_lock_wait(what, exc)
    return None


def stage_name(stage: Callable) -> str:
    """A stage for log lines: its object's class (Relay, Worker, Scheduler...) or its own name."""
    owner = getattr(stage, "__self__", None)
    return type(owner).__name__ if owner is not None else getattr(stage, "__name__", repr(stage))


def _pause(budget: Budget, seconds: float, listener: Listener | None = None) -> bool:
    """Sleep up to `seconds` in small steps (a signal ends it), or until `listener` hears of new work;
    False when the run has no time left."""
    if budget.signalled or budget.remaining() <= 0.05:
        return False
    end = clock.monotonic() + min(seconds, budget.remaining())
    while clock.monotonic() < end:
        if budget.signalled:
            return False
        step = min(0.1, max(end - clock.monotonic(), 0))
        if listener is None:
            time.sleep(step)
        elif listener.wait(step):
            break
    return budget.remaining() > 0.05 and not budget.signalled


def record_run(sessions, command: str, body: Callable[[], RunResult], counts: Callable[[], dict]) -> RunResult:
    """Write a heartbeat row around a run and finish it with the run's counts and outcome."""
    try:
        heartbeat_id = heartbeat.start(sessions, command)
    except OperationalError as exc:
        if not is_lock_conflict(exc):
            raise
        return stopped_by_lock_wait("the heartbeat row", exc)  # nothing ran yet, nothing to record
    try:
        result = body()
    except BaseException as exc:
        try:
            heartbeat.finish(sessions, heartbeat_id, outcome="error", error=describe(exc), **counts())
        except Exception:
            pass  # the database is what failed; the row stays "running"
        raise
    try:
        heartbeat.finish(sessions, heartbeat_id, outcome=result.stop_reason, error=result.error, **counts())
    except DBAPIError as exc:
        if is_lock_conflict(exc):
            # Another transaction still holds a lock its counts or its row need, and the run's time is
            # up (its waits are bounded by it): the run's own outcome stands; the row stays "running".
            log.warning("could not finish the heartbeat row: another transaction still holds a lock")
            return result
        if not (is_connection_lost(exc) and result.stop_reason == "lost-connection"):
            raise
        # The run already ended on the database being away: its summary says so; the row stays
        # "running" (as for a killed run) rather than the run ending on a second, vaguer error.
        log.warning("could not finish the heartbeat row: database still unreachable")
    return result
