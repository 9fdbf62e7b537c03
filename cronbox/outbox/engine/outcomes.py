"""A family's outcomes: the token-guarded writes that end (or extend) a claimed item's attempt, with
their counters and log lines.

A claimed item owns its outcome (as Solid Queue's claimed execution does): whoever ends an attempt
writes it here, so every item of a family is acked, retried, given up on, released and extended
the same way, counted in one `RunStats` and logged in one line format: the runner
(outbox.engine.runner), a commit group's members (outbox.engine.group_commit), the forwarder's
confirms and failures (outbox.events.forwarder) and `amqp work` (outbox.queue.broker_worker).

The SQL is the family's store module's (`LeaseStore`: outbox.events.deliveries,
outbox.queue.jobstore), each write guarded by the claim token (False / a short count: the lease was
lost to another run, whose outcome wins; said in a `lease-lost` line). `Joined` writes go in the
transaction of every outcome (a job's concurrency-group slot is freed with it:
outbox.queue.job_family.Slots), so a feature that must change with an item's outcome joins its
transaction instead of writing its own. A write is in its own short transaction of the run
(outbox.engine.connection.RunConnection), or in an open commit group's (`group=`: its counters and
line then wait for the group's COMMIT).

What a family brings besides its store is a `Family`: data and functions, no subclass.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Protocol

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import is_lock_conflict
from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.lock_wait import lock_wait_error
from cronbox.outbox.core.logs import log_text
from cronbox.outbox.core.text import ascii_text, describe
from cronbox.outbox.engine.connection import RunConnection
from cronbox.outbox.engine.context import Context, HandlerTransaction
from cronbox.outbox.engine.handler_call import ERROR, PERMANENT, RETRY_LATER, Outcome
from cronbox.outbox.engine.settle import settle

log = logging.getLogger("cronbox")

LEASE_LOST = "lease-lost"


class LeaseStore(Protocol):
    """The writes of a family's outcomes, each guarded by the item's claim token (False / a short
    count: the lease was lost to another run, whose outcome wins). The family's store module
    implements them beside its claim SQL. `ack` takes the items of one claim token and what their
    handlers returned that the family keeps (`values`, by item id: a job's result)."""

    def ack(self, session: Session, items: list, token: str, now: datetime,
            values: dict[int, Any] | None = None) -> int: ...
    def reschedule(self, session: Session, item, next_at: datetime, error: str | None,
                   refund_attempt: bool) -> bool: ...
    def give_up(self, session: Session, item, error: str, traceback: str | None, now: datetime, *,
                refund_attempt: bool = False) -> bool: ...
    def release(self, session: Session, ids: list[int], token: str, now: datetime) -> int: ...
    def extend(self, session: Session, item, lease_until: datetime) -> bool: ...


class Joined(Protocol):
    """Writes that join the transaction of each outcome of a family, after the store's write.
    `ended`: the attempts of `items` ended (acked, retried, given up on or released; `values`, per
    item id, what an ack carries for them, when it carries anything); `extended`: an item's lease
    was extended (`held`: still ours)."""

    def ended(self, session: Session, items: list, values: dict[int, Any] | None) -> None: ...
    def extended(self, session: Session, item, lease_until: datetime, held: bool) -> None: ...


def retry_later_at(item, outcome: Outcome, now: datetime) -> datetime | None:
    """When a RetryLater item runs again: after the delay it asked for (a family may bound it: None
    gives up instead)."""
    return now + timedelta(seconds=outcome.retry_in or 0)


@dataclass(frozen=True)
class Family:
    """What tells one family of claimed items from another, for the runner and the outcomes."""

    kind: str  # "delivery" / "job", for log lines and idempotency keys
    gave_up_word: str  # the outcome of giving up: "dead" / "failed"
    handler: Callable[[Any], Any]  # item -> its handler, None when not registered here
    args: Callable[[Any, Context], tuple]  # item, ctx -> the handler's arguments
    describe: Callable[[Any], str]  # item -> its ids for a log line
    retry_later_at: Callable[[Any, Outcome, datetime], datetime | None] = retry_later_at
    # Extra writes in the transaction that reschedules a RetryLater (jobs: a channel pause recorded)
    on_retry_later: Callable[[Session, Any, Outcome, datetime], None] | None = None
    # What an ack keeps of a handler's return value (jobs: its JSON, outbox.queue.results.encode),
    # or None: the value is dropped. A value it refuses (PayloadError) fails the attempt for good.
    keep_value: Callable[[Any], Any] | None = None


def exhausted(item, handler) -> bool:
    """Were the item's attempts used up before this claim (its last one claimed and never finished:
    the process killed, or its lease expired)? It is given up on without running
    (Outcomes.give_up_exhausted)."""
    return item.attempts > handler.max_attempts


def last_attempt(attempt: int, handler) -> bool:
    """Was attempt `attempt` the handler's last? A failure then gives up instead of retrying."""
    return attempt >= handler.max_attempts


@dataclass
class RunStats:
    done: int = 0
    retried: int = 0
    deferred: int = 0  # RetryLater: waiting again, no attempt used
    gave_up: int = 0  # dead deliveries / failed jobs
    lease_lost: int = 0
    fanned: int = 0  # relay only: events fanned out to deliveries


class Outcomes:
    """One family's outcomes in one run (see the module's docstring)."""

    def __init__(self, family: Family, store: LeaseStore, db: RunConnection, *, joined: tuple[Joined, ...] = ()):
        self.family = family
        self.kind = family.kind
        self.store = store
        self.db = db
        self.joined = joined
        self.stats = RunStats()
        self.values: dict[int, Any] = {}  # item id -> what its ack carries (Family.keep_value), until the batch ends

    # -- returned -----------------------------------------------------------------
    def returned(self, item, outcome: Outcome) -> Outcome:
        """What the handler returned (`outcome.value`), kept for the item's ack when the family keeps
        it (Family.keep_value); a value it refuses makes the attempt a permanent failure (recorded,
        with the reason: nothing is lost)."""
        self.values.pop(item.id, None)  # an earlier run of it in this batch (a lost commit group)
        keep = self.family.keep_value
        if keep is None or not outcome.ok or outcome.value is None:
            return outcome
        try:
            self.values[item.id] = keep(outcome.value)
        except PayloadError as exc:
            return Outcome(PERMANENT, outcome.seconds, str(exc))
        return outcome

    def closed(self) -> None:
        """The batch is over: what its acks carried goes."""
        self.values.clear()

    # -- done ---------------------------------------------------------------------
    def ack(self, session: Session, items: list, now: datetime) -> int:
        """The items done, in the caller's transaction: one UPDATE per claim token (the items acked
        together may come from more than one claim), with what their handlers returned that the
        family keeps (`returned`). Returns how many were still ours."""
        kept = self.values
        values = {item.id: kept[item.id] for item in items if item.id in kept} if kept else None
        if len(items) == 1:  # the common case of an item acked with its handler's writes
            acked = self.store.ack(session, items, items[0].claim_token, now, values)
        else:
            by_token: dict[str, list] = {}
            for item in items:
                by_token.setdefault(item.claim_token, []).append(item)
            acked = sum(self.store.ack(session, token_items, token, now, values)
                        for token, token_items in by_token.items())
        for joined in self.joined:
            joined.ended(session, items, values)
        return acked

    def acked(self, items: list, acked: int, note: str | None = None) -> None:
        """Counters and log lines of a committed ack of `items`, `acked` of them still ours."""
        self.stats.done += acked
        self.stats.lease_lost += len(items) - acked
        handler, line = self.family.handler, self.line
        for item in items:
            line(item, handler(item), "done", None, note)
        if acked != len(items):
            log.warning("%s: %d of %d acks found their lease expired (another run may repeat them)",
                        self.kind, len(items) - acked, len(items))

    def ack_now(self, items: list, *, note: str | None = None, fail_blocked: bool = True) -> None:
        """Ack `items` in a transaction of their own. If their rows stay locked by another transaction
        until the run's time runs out, each attempt fails, naming the lock wait (`fail_blocked`;
        else the error is raised, as any other is)."""
        crash_point("before-ack-commit")
        waiting_since = time.monotonic()
        try:
            acked = self.db.transaction(lambda s: self.ack(s, items, clock.utcnow()), ack=True)
        except OperationalError as exc:
            if not (fail_blocked and is_lock_conflict(exc)):
                raise
            error = lock_wait_error("the ack", time.monotonic() - waiting_since)
            log.warning("%s: %d finished items not acked: %s", self.kind, len(items), error)
            for item in items:  # recorded if its row can be written by then; if not, the run stops
                self.failed(item, self.family.handler(item), Outcome(ERROR, 0.0, error))
            return
        crash_point("after-ack-commit")
        self.acked(items, acked, note)

    def ack_with(self, item, handler, ctx: Context, outcome: Outcome) -> Outcome:
        """Commit the handler's ctx.session writes and the item's ack together, or neither
        (outbox.engine.settle); a failed attempt's outcome if they could not be, or LEASE_LOST."""
        self.db.bound_lock_waits()

        def ack(transaction: HandlerTransaction) -> Outcome | None:
            if self.ack(transaction.session, [item], clock.utcnow()) == 1:
                return None
            return Outcome(LEASE_LOST, outcome.seconds)

        settled = settle(ctx, outcome, ack, who=self.family.describe(item))
        if settled.kind == LEASE_LOST:
            self.stats.lease_lost += 1
            self.line(item, handler, LEASE_LOST, outcome, "lease expired before the ack; rolled back")
        elif settled.ok:
            crash_point("after-ack-commit")
            self.stats.done += 1
            self.line(item, handler, "done", outcome)
        return settled

    # -- failed -------------------------------------------------------------------
    def failed(self, item, handler, outcome: Outcome, group=None) -> None:
        """A failed attempt (or RetryLater): retried after the handler's backoff (RetryLater: when it
        asked, no attempt used), or given up on after its last attempt or a permanent failure."""
        now = clock.utcnow()
        if outcome.kind == RETRY_LATER:
            next_at = self.family.retry_later_at(item, outcome, now)
            if next_at is None:
                # Given up as a RetryLater, which uses no attempt (nor does a refusal before the call):
                # the claim's attempt is given back, as a reschedule would.
                self.give_up(item, handler, Outcome(PERMANENT, outcome.seconds,
                                                    f"{outcome.error}; retry_until has passed"),
                             group, refund_attempt=True)
                return
            on_retry_later = self.family.on_retry_later

            def reschedule(session: Session) -> bool:
                if not self._reschedule(session, item, next_at, None, True):
                    return False
                if on_retry_later is not None:
                    on_retry_later(session, item, outcome, now)
                return True

            held = self._write(group, reschedule)

            def deferred() -> None:
                if self._lease_held(held, item, handler, outcome):
                    self.stats.deferred += 1
                    self.line(item, handler, "retry-later", outcome)

            self._then(group, deferred)
            return
        if outcome.kind == PERMANENT or last_attempt(item.attempts, handler):
            self.give_up(item, handler, outcome, group)
            return
        next_at = now + timedelta(seconds=handler.backoff.delay(item.attempts))
        held = self._write(group, lambda s: self._reschedule(s, item, next_at, outcome.error, False))

        def retried() -> None:
            if self._lease_held(held, item, handler, outcome):
                self.stats.retried += 1
                self.line(item, handler, "retry", outcome, f"next in {(next_at - now).total_seconds():.0f}s")

        self._then(group, retried)

    def give_up(self, item, handler, outcome: Outcome, group=None, *, refund_attempt: bool = False) -> None:
        """Dead / failed. refund_attempt: given up on without using an attempt (the claim's is given back
        in the same UPDATE, and the log line says the attempts that ran)."""
        def give_up(session: Session) -> bool:
            held = self.store.give_up(session, item, outcome.error or "failed", outcome.traceback, clock.utcnow(),
                                      refund_attempt=refund_attempt)
            self._ended(session, item)
            return held

        held = self._write(group, give_up)
        attempt = item.attempts - 1 if refund_attempt else item.attempts

        def gave_up() -> None:
            if self._lease_held(held, item, handler, outcome, attempt=attempt):
                self.stats.gave_up += 1
                self.line(item, handler, self.family.gave_up_word, outcome, attempt=attempt)

        self._then(group, gave_up)

    def give_up_exhausted(self, item, handler) -> None:
        """Give up, without running it, on an item whose attempts are used up (`exhausted`): dead /
        failed. This claim counted one more attempt, which never runs: the give-up takes it back in
        the same UPDATE, so the row (`queue failed`, `outbox dead`, the console), its error and the
        log line all say the attempts that ran (issue 35: a `tries=3` job showed `attempts 4` beside
        "attempt 3 of 3")."""
        self.give_up(item, handler, Outcome(
            "exhausted", 0.0, f"gave up: attempt {item.attempts - 1} of {handler.max_attempts} was claimed but "
                              "never finished (process killed or lease expired)"), refund_attempt=True)

    def record_plain_error(self, item, exc: Exception) -> bool:
        """Storing the handler's outcome failed (text or values the database refuses): record a
        plain ASCII error instead, by the usual retry rules. False if that fails too."""
        describe_item = self.family.describe(item)
        log.error("%s trace=%s: could not record the outcome (%s); recording a plain error instead",
                  describe_item, item.trace_id, log_text(describe(exc)))
        error = ascii_text(f"outcome not recordable: {describe(exc, 900)}")
        try:
            self.failed(item, self.family.handler(item), Outcome(ERROR, 0.0, error))
        except Exception as err:
            log.error("%s: could not record a plain error either (%s)", describe_item, log_text(describe(err)))
            return False
        return True

    # -- not started --------------------------------------------------------------
    def not_runnable_here(self, item, wait: float, error: str) -> None:
        """An item this run holds, its attempt not counted, whose handler is not registered here (a
        job `amqp work` took off the broker under its message's claim, published by other code):
        ready again in `wait` seconds for a run that has the handler, `error` in its row. A RetryLater
        of no attempt, counted and logged as one."""
        next_at = clock.utcnow() + timedelta(seconds=wait)
        outcome = Outcome(RETRY_LATER, 0.0, error, retry_in=wait)
        held = self._write(None, lambda s: self._reschedule(s, item, next_at, error, False))
        if self._lease_held(held, item, None, outcome):
            self.stats.deferred += 1
            self.line(item, None, "retry-later", outcome, f"not registered here; waiting {wait:.0f}s, no attempt used")

    def release(self, items: list, *, best_effort: bool = False) -> None:
        """Give back claimed items not started (their attempt not counted), in one transaction."""
        if not items:
            return
        token = items[0].claim_token

        def release(session: Session) -> int:
            released = self.store.release(session, [i.id for i in items], token, clock.utcnow())
            for joined in self.joined:
                joined.ended(session, items, None)
            return released

        try:
            released = self.db.transaction(release)
        except Exception:
            if not best_effort:
                raise
            log.warning("%s: could not release %d claimed items; their leases will expire", self.kind, len(items))
            return
        log.info("%s: released %d claimed but not started", self.kind, released)

    def lease_covers(self, item, handler) -> bool:
        """Extend the lease when the handler, started now, could outlast it (the rest of its batch used
        it up); False if the item is no longer ours."""
        if not outlasts(handler, item.lease_until):
            return True
        lease_until = clock.utcnow() + timedelta(seconds=handler.timeout + self.db.runtime.settings.lease_margin)

        def extend(session: Session) -> bool:
            held = self.store.extend(session, item, lease_until)
            for joined in self.joined:
                joined.extended(session, item, lease_until, held)
            return held

        if self.db.transaction(extend):
            return True
        self.stats.lease_lost += 1
        log.warning("%s lease-lost before start (another run holds it)", self.family.describe(item))
        return False

    # -- the writes' plumbing -----------------------------------------------------
    def _reschedule(self, session: Session, item, next_at: datetime, error: str | None, refund_attempt: bool) -> bool:
        held = self.store.reschedule(session, item, next_at, error, refund_attempt)
        self._ended(session, item)
        return held

    def _ended(self, session: Session, item) -> None:
        for joined in self.joined:
            joined.ended(session, [item], None)

    def _write(self, group, work: Callable[[Session], bool]) -> bool:
        """A write in its own short transaction, or in the open commit group's."""
        return self.db.transaction(work) if group is None else work(group.session)

    @staticmethod
    def _then(group, report: Callable[[], None]) -> None:
        """Counters and log lines of a write: now, or once the group's COMMIT made it true."""
        if group is None:
            report()
        else:
            group.after_commit.append(report)

    def _lease_held(self, held: bool, item, handler, outcome: Outcome, *, attempt: int | None = None) -> bool:
        """A token-guarded update that matched nothing: another run holds the item now; say so."""
        if not held:
            self.stats.lease_lost += 1
            self.line(item, handler, LEASE_LOST, outcome, "another run holds it now; this outcome is not recorded",
                      attempt=attempt)
        return held

    def line(self, item, handler, outcome_name: str, outcome: Outcome | None, note: str | None = None, *,
             attempt: int | None = None) -> None:
        """One line per outcome; `attempt`: the attempts that ran, when not the claim's count. Not even
        made when the logger's level leaves it out (a host may keep only warnings)."""
        if outcome_name == "done":
            level = logging.INFO
        elif outcome_name == self.family.gave_up_word:
            level = logging.ERROR
        else:
            level = logging.WARNING
        if not log.isEnabledFor(level):
            return
        ms = f"{outcome.seconds * 1000:.1f}" if outcome else "-"
        attempt = item.attempts if attempt is None else attempt
        line = (f"{self.family.describe(item)} outcome={outcome_name} "
                f"attempt={attempt}/{handler.max_attempts if handler else '?'} trace={item.trace_id} ms={ms}")
        if outcome is not None and outcome.error:
            line += f" error={log_text(outcome.error)!r}"  # the full text is in the item's row
        if note:
            line += f" ({note})"
        log.log(level, line)


def outlasts(handler, lease_until: datetime | None) -> bool:
    """Could this handler, started now, still run when `lease_until` passes?"""
    return lease_until is not None and clock.utcnow() + timedelta(seconds=handler.timeout) > lease_until
