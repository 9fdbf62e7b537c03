"""Running claimed work: shared by the outbox relay (deliveries) and the job worker (jobs).

For each claimed item, in claim order:
1. stop if the budget says so, giving back (releasing) what was claimed but not started;
2. make sure the lease still covers the handler's timeout, extending it if the
   batch took long (a lease that ran out could let another run start the same item);
3. give up at once on an item whose attempts are used up (a crash mid-attempt), giving back the
   attempt its claim counted (give_up_exhausted: the row keeps the attempts that ran);
4. call the handler with a fresh Context, then
   - success with ctx.session used: the ack joins the handler's transaction (exactly once;
     the handler's session only ever holds savepoints in it, see outbox.engine.context);
   - success without it: the ack is batched with the others (nothing to protect), written at the
     batch's end, or once handlers ran CRONBOX_ACK_FLUSH since (QuietAcks: what a crash repeats);
   - RetryLater: back to waiting without using an attempt (subclasses may bound it);
   - failure: retry after the handler's backoff, or give up (dead / failed).

Every state change is guarded by the claim token; a lost lease is rolled back and logged.
Whatever a handler raises or returns ends as that item's outcome (outbox.engine.handler_call); if even
recording it fails for a reason other than the database going away, a plain ASCII error is
recorded instead, so one bad item never stops the run. Log lines carry the error masked
(outbox.core.logs.log_text); the full text goes only to the item's row.
Each family supplies its store (the module that owns its rows' SQL: `LeaseStore` below), the
handler lookup and the handler's arguments.

Consecutive items of grouped handlers (`grouped=True`) run in one transaction instead
(`_run_group`; the group's transaction and rules: outbox.engine.group_commit); a group that cannot
commit hands its members back to this loop, to run again one per transaction.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import is_connection_lost, is_lock_conflict
from cronbox.outbox.core.engines import session_factory
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.lock_wait import bound_lock_wait, lock_wait_error
from cronbox.outbox.core.logs import log_text
from cronbox.outbox.core.text import ascii_text, describe
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.admission import NEVER_FITS_DELAY, Admission, Verdict
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.context import Context
from cronbox.outbox.engine.group_commit import CULPRIT, FAILED, CommitGroup, may_join
from cronbox.outbox.engine.handler_call import ERROR, PERMANENT, RETRY_LATER, TIMEOUT, Outcome, call_handler

log = logging.getLogger("cronbox")


class LeaseStore(Protocol):
    """The writes the processor makes to a family's rows, each guarded by the item's claim token
    (False / a short count: the lease was lost to another run, whose outcome wins). The family's
    store module implements them beside its claim SQL."""

    def ack(self, session: Session, ids: list[int], token: str, now: datetime) -> int: ...
    def reschedule(self, session: Session, item, next_at: datetime, error: str | None,
                   refund_attempt: bool) -> bool: ...
    def give_up(self, session: Session, item, error: str, traceback: str | None, now: datetime, *,
                refund_attempt: bool = False) -> bool: ...
    def release(self, session: Session, ids: list[int], token: str, now: datetime) -> int: ...
    def extend(self, session: Session, item, lease_until: datetime) -> bool: ...


@dataclass
class RunStats:
    done: int = 0
    retried: int = 0
    deferred: int = 0  # RetryLater: waiting again, no attempt used
    gave_up: int = 0  # dead deliveries / failed jobs
    lease_lost: int = 0
    fanned: int = 0  # relay only: events fanned out to deliveries


class QuietAcks:
    """Finished items whose handlers wrote nothing: acked together in one statement, before the
    earliest of their leases runs out, and once handlers ran `window` seconds (CRONBOX_ACK_FLUSH)
    since the first of them started. A run killed before their ack runs them all again once their
    leases end, repeating whatever they did outside the database: the window bounds that repeat to
    the items finished in its last `window` of handler time (and the one in hand), while fast
    items still share one UPDATE per batch. Handler time, not wall time: the repeats are handler
    calls, and a loaded machine stretching the processor's own steps does not split a batch."""

    def __init__(self, window: float):
        self.window = window
        self.items: list = []
        self.earliest_lease: datetime | None = None
        self.handler_seconds = 0.0  # handler time since the first item's handler started

    def add(self, item, seconds: float) -> None:
        """A finished item, whose handler ran `seconds`."""
        self.items.append(item)
        self.handler_seconds += seconds
        if self.earliest_lease is None or item.lease_until < self.earliest_lease:
            self.earliest_lease = item.lease_until

    def ran(self, seconds: float) -> None:
        """Another item's handler ran `seconds` (its outcome written on its own) while these waited."""
        if self.items:
            self.handler_seconds += seconds

    @property
    def due(self) -> bool:
        """Have they waited their window? Then they are acked before another handler starts."""
        return bool(self.items) and self.handler_seconds >= self.window

    def take(self) -> list:
        items, self.items, self.earliest_lease, self.handler_seconds = self.items, [], None, 0.0
        return items

    def __bool__(self) -> bool:
        return bool(self.items)


class Processor:
    kind = "item"  # "delivery" / "job", for log lines

    def __init__(self, runtime):
        self.runtime = runtime
        self.sessions = runtime.sessions
        self.connection: Connection | None = None  # the round's connection, while run() holds one
        self.stats = RunStats()
        self._started = False  # has the current item's handler been called?
        self._upcoming = None  # the item after the current one in its batch, if any (for _holds_until_ack)
        self._group: CommitGroup | None = None  # the group whose transaction is open, if any
        self._on_db_error = self._watch_group  # one bound method, to remove the listener again
        self.admission = Admission(self.kind, runtime.settings)  # profiles: checked before, recorded after
        self._budget: Budget | None = None  # the budget of the batch being processed: bounds lock waits

    store: LeaseStore  # outbox.events.deliveries / outbox.queue.jobstore

    # -- to implement --------------------------------------------------------------
    def _handler(self, item): raise NotImplementedError
    def _args(self, item, ctx: Context) -> tuple: raise NotImplementedError
    def _describe(self, item) -> str: raise NotImplementedError

    def _before_call(self, item, handler) -> Outcome | None:
        """A gate before the handler (jobs: channel pauses, rate limits); an Outcome skips the call."""
        return None

    def _returned(self, item, outcome: Outcome) -> Outcome:
        """What the handler returned (`outcome.value`), before its outcome is written (issue 39: a job
        keeps it for its ack to store as its result; one it cannot store becomes a failure)."""
        return outcome

    def _holds_until_ack(self, item) -> bool:
        """Does the item hold something others wait for until its ack (jobs: a concurrency-group
        slot, unless the next item takes it over)? Then its ack is not batched with later items' but
        written at once."""
        return False

    def _on_retry_later(self, session, item, handler, outcome: Outcome, now: datetime) -> None:
        """Extra writes in the transaction that reschedules a RetryLater (jobs: record a channel pause)."""

    def _retry_later_at(self, item, handler, outcome: Outcome, now: datetime) -> datetime | None:
        """When a RetryLater item runs again; None means give up instead (jobs: retry_until)."""
        return now + timedelta(seconds=outcome.retry_in or 0)

    # -- the loop ------------------------------------------------------------------
    def on_one_connection(self, run: Callable[[], int]) -> int:
        """Run a round on one pooled connection (never a transaction across handlers): every
        checkout would otherwise cost a pre-ping and a reset ROLLBACK, two round trips per item."""
        with self.holding_a_connection():
            return run()

    @contextmanager
    def holding_a_connection(self) -> Iterator[Connection]:
        """The round's connection, held until the block ends (on_one_connection; the broker worker
        holds it while messages flow), its handler profiles written once at the end."""
        self.runtime.claim_mode()  # may ask the server its version: before we hold the only connection
        engine = self.runtime.engine
        with engine.connect() as connection:
            self.connection, self.sessions = connection, session_factory(connection)
            event.listen(engine, "handle_error", self._on_db_error)
            try:
                yield connection
            finally:
                self._profiles(lambda: self.admission.flush(self.sessions, force=True))
                event.remove(engine, "handle_error", self._on_db_error)
                self.connection, self.sessions = None, self.runtime.sessions

    def _watch_group(self, context) -> None:
        """The engine's handle_error listener while the run holds its connection: any statement on
        it, a handler's raw SQL too, may lose the open group (CommitGroup.lose_on_error)."""
        if self._group is not None:
            self._group.lose_on_error(context)

    def process(self, claimed: list, budget: Budget) -> int:
        """Run a claimed batch (see the module's docstring); how many items were handled."""
        try:
            return self._process(claimed, budget)
        except OperationalError as exc:
            if not is_lock_conflict(exc):
                raise
            # A write of the run waited for a lock until the run's time was up (outbox.core.lock_wait):
            # what it could not record, and what it could not give back, is retried by a later run
            # once its lease expires. The run stops; it never waits past its time.
            log.error("%s: stopping the run: a write still waited for a lock another transaction holds when the "
                      "run's time ran out (%s); items not recorded run again when their leases expire",
                      self.kind, log_text(describe(exc, 200)))
            budget.stop("lock-wait")
            self._bound_lock_waits()  # 1 s, the run's time being up: its last writes wait no longer
            return 0

    def _process(self, claimed: list, budget: Budget) -> int:
        # The profiles are read (again once a minute) when there is work to admit, between the claim's
        # transaction and the first item's: a run that finds nothing due never reads them.
        self._budget = budget
        if claimed:
            self._profiles(lambda: self.admission.start(self.sessions))
            self._bound_lock_waits()
        quiet_acks = QuietAcks(self.runtime.settings.ack_flush)
        handled = 0
        work = list(claimed)  # a lost group puts its members back here, to run alone
        alone: set[int] = set()
        index = 0
        while index < len(work):
            item = work[index]
            if index and budget.stop_reason() is not None:
                self._release(work[index:])
                break
            try:
                deferred = self._deferred(item, budget)
            except BaseException:  # its release or wait not written: as for an item never started
                self._flush(quiet_acks, best_effort=True)
                self._release(work[index:], best_effort=True)
                raise
            if deferred:
                index += 1
                continue
            if item.id not in alone and self._groupable(item, self._handler(item), item.claim_token):
                self._flush(quiet_acks)  # its own transaction: before the group opens one on the connection
                taken, done, rerun = self._run_group(work, index, budget)
                work[index:index + taken] = rerun  # the next item is at `index` again
                alone.update(i.id for i in rerun)
                handled += done
                continue
            self._started = False
            self._upcoming = work[index + 1] if index + 1 < len(work) else None
            try:
                try:
                    ran = self._run_one(item, quiet_acks, budget)
                except Exception as exc:
                    # Recording what the handler did failed: unless the database went away, one
                    # item must not stop the run (or crash every later one on the same item).
                    if (not self._started or is_connection_lost(exc) or is_lock_conflict(exc)
                            or not self._record_unrecordable(item, exc)):
                        raise
                    ran = True
            except BaseException:
                # Database gone, or an interrupt: ack what finished, give back what never started
                # (this item too, if it failed before its handler was called).
                self._flush(quiet_acks, best_effort=True)
                self._release(work[index + (1 if self._started else 0):], best_effort=True)
                raise
            handled += ran
            index += 1
        self._flush(quiet_acks)
        self._profiles(lambda: self.admission.flush(self.sessions))
        return handled

    # -- admission ---------------------------------------------------------------------
    def _deferred(self, item, budget: Budget) -> bool:
        """Admission (outbox.engine.admission) before the item starts: True when it was given back,
        without using an attempt: released, the run stopping (it fits a later run), or waiting
        NEVER_FITS_DELAY (it fits no run like this one)."""
        handler = self._handler(item)
        if handler is None or item.attempts > handler.max_attempts:
            return False
        verdict: Verdict | None = self.admission.check(handler.name, budget)
        if verdict is None:
            return False
        if verdict.later:
            log.warning("%s deferred: %s; given back, stopping the run", self._describe(item), verdict.reason)
            self._release([item])
            self.stats.deferred += 1
            budget.stop(verdict.stop)
        else:
            log.warning("%s never fits: %s; waiting %.0fs (no attempt used)", self._describe(item), verdict.reason,
                        NEVER_FITS_DELAY)
            self._after_failure(item, handler, Outcome(RETRY_LATER, 0.0, f"never fits: {verdict.reason}",
                                                       retry_in=NEVER_FITS_DELAY))
        return True

    def _profiles(self, work: Callable[[], None]) -> None:
        """Reading and writing profiles is best effort: an estimate never fails a run."""
        try:
            work()
        except Exception as exc:
            log.warning("%s: handler profiles not read/written (%s)", self.kind, log_text(describe(exc, 200)))

    def _call(self, handler, args: tuple, ctx: Context, budget: Budget) -> Outcome:
        """The handler's call, measured into its profile and the budget."""
        probe = self.admission.probe()
        outcome = call_handler(handler.fn, args, timeout=handler.timeout, scope=self.runtime.scope_for(ctx))
        budget.record(outcome.seconds, self.admission.record(handler.name, probe, outcome.seconds))
        return outcome

    def _run_one(self, item, quiet_acks: QuietAcks, budget: Budget) -> bool:
        handler = self._handler(item)
        if handler is None:  # not registered here any more: give the lease back
            self._release([item])
            return False
        if quiet_acks.due or (quiet_acks and self._outlasts(handler, quiet_acks.earliest_lease)):
            # Ack them while their leases still hold, or another run repeats them; and before a crash
            # would repeat more than the window's worth of them.
            self._flush(quiet_acks)
        if not self._lease_covers(item, handler):
            return False
        if item.attempts > handler.max_attempts:
            self.give_up_exhausted(item, handler)
            return True
        crash_point("after-claim")
        # The random trace id makes the key unique for good: SQLite (and MySQL 5.7 after a restart)
        # hands out a pruned row's id again, and keys outlive their rows (notifications, send attempts).
        ctx = Context(attempt=item.attempts, trace_id=item.trace_id,
                      idempotency_key=f"{self.kind}-{item.id}-{item.trace_id}",
                      connection=self.connection, settings=self.runtime.settings)
        try:
            outcome = self._before_call(item, handler)
            if outcome is None:
                self._started = True
                outcome = self._call(handler, self._args(item, ctx), ctx, budget)
                outcome = self._returned(item, outcome)  # issue 39: the family keeps (or refuses) its value
            if outcome.ok and not ctx.session_used:
                quiet_acks.add(item, outcome.seconds)
                # A due ack frees a held slot too: no handover to the next job (_holds_until_ack) then.
                if quiet_acks.due or self._holds_until_ack(item):
                    self._flush(quiet_acks)
                return True
            quiet_acks.ran(outcome.seconds)
            if outcome.ok:
                outcome = self._ack_with_session(item, handler, ctx, outcome)
                if outcome.ok or outcome.kind == "lease-lost":
                    return True
            else:
                ctx.discard_session(invalidate=outcome.kind == TIMEOUT)
        finally:
            ctx.discard_session()  # whatever happened, the handler's transaction is over before the next write
        self._after_failure(item, handler, outcome)
        return True

    # -- group commit (outbox.engine.group_commit) ---------------------------------------
    def _groupable(self, item, handler, token: str) -> bool:
        """May this item join a group? (group_commit.may_join; jobs add their own condition.)"""
        return self.connection is not None and may_join(item, handler, token, self.runtime.settings)

    def _run_group(self, work: list, start: int, budget: Budget) -> tuple[int, int, list]:
        """Run work[start], then the grouped items after it, in one transaction (see CommitGroup).
        Returns (items taken from `work`, items handled, items to run again alone, in order)."""
        settings = self.runtime.settings
        group = CommitGroup(self.connection, work[start].claim_token)
        ran: list = []  # members whose handler was called, in order
        culprit = None  # (item, handler, outcome) whose own timeout lost the group
        # The group's acks commit at its end: it stays open no longer than CRONBOX_ACK_FLUSH either.
        deadline = clock.monotonic() + min(settings.group_ms / 1000, settings.ack_flush)
        index = start
        self._group = group
        try:
            while index < len(work) and len(ran) < settings.group_max and not group.lost:
                item = work[index]
                handler = self._handler(item)
                # No member joins once the group's time is up: a lock a member took is held at most
                # CRONBOX_GROUP_MS plus the run of the member running then (never cut short: a
                # timer firing mid-query costs the connection, and then every member's work).
                if ran and (clock.monotonic() >= deadline or budget.stop_reason() is not None
                            or not self._groupable(item, handler, group.token)
                            or self.admission.check(handler.name, budget) is not None):  # process() defers it
                    break
                index += 1
                crash_point("after-claim")
                ctx = Context(attempt=item.attempts, trace_id=item.trace_id,
                              idempotency_key=f"{self.kind}-{item.id}-{item.trace_id}",
                              connection=self.connection, settings=settings, commit_group=group)
                outcome = self._call(handler, self._args(item, ctx), ctx, budget)
                outcome = self._returned(item, outcome)  # issue 39
                ran.append(item)
                end, outcome = group.settle(item, ctx, outcome)
                if end == CULPRIT:
                    culprit = (item, handler, outcome)
                elif end == FAILED:
                    try:  # its retry or give-up, written in the group's transaction
                        self._after_failure(item, handler, outcome, group)
                    except Exception as exc:
                        group.lost = group.lost or f"could not record a failure: {describe(exc, 200)}"
            if not group.lost:
                self._commit_group(group)
        except BaseException:
            # An interrupt or a crash-like failure: nothing of the group committed; give every
            # member and the rest back (attempts refunded), as for items never started.
            self._group = None
            group.close()
            self._release(work[start:], best_effort=True)
            raise
        self._group = None
        if group.lost is None:
            return index - start, len(ran), []
        group.close()
        rerun = [item for item in ran if culprit is None or item is not culprit[0]]
        log.warning("%s: group of %d lost (%s); %d run again one per transaction", self.kind, len(ran),
                    group.lost, len(rerun))
        if culprit is not None:
            self._after_failure(*culprit)  # its own timeout: its attempt counts, in a transaction of its own
        return index - start, 1 if culprit is not None else 0, rerun

    def _commit_group(self, group: CommitGroup) -> None:
        """Commit the group (CommitGroup.commit), or, when no member wrote, ack the members alone (as
        QuietAcks); then the counters and log lines its COMMIT made true."""
        items = group.acks
        now = clock.utcnow()
        if group.outer is None:
            ids = [item.id for item in items]
            acked = 0
            if ids:
                crash_point("before-ack-commit")
                acked = self._transaction(lambda s: self.store.ack(s, ids, group.token, now))
                crash_point("after-ack-commit")
            self.stats.lease_lost += len(ids) - acked
            if acked != len(ids):
                log.warning("%s: %d of %d acks found their lease expired (another run may repeat them)",
                            self.kind, len(ids) - acked, len(ids))
        else:
            acked = group.commit(self.store, now)
            if group.lost:
                return
        group.close()
        self.stats.done += acked
        for item in items:
            self._log(item, self._handler(item), "done", None, "grouped")
        for report in group.after_commit:
            report()

    def _record_unrecordable(self, item, exc: Exception) -> bool:
        """Storing the handler's outcome failed (text or values the database refuses): record a
        plain ASCII error instead, by the usual retry rules. False if that fails too."""
        handler = self._handler(item)
        log.error("%s trace=%s: could not record the outcome (%s); recording a plain error instead",
                  self._describe(item), item.trace_id, log_text(describe(exc)))
        error = ascii_text(f"outcome not recordable: {describe(exc, 900)}")
        try:
            self._after_failure(item, handler, Outcome(ERROR, 0.0, error))
        except Exception as err:
            log.error("%s: could not record a plain error either (%s)", self._describe(item), log_text(describe(err)))
            return False
        return True

    @staticmethod
    def _outlasts(handler, lease_until: datetime | None) -> bool:
        """Could this handler, started now, still run when `lease_until` passes?"""
        return lease_until is not None and clock.utcnow() + timedelta(seconds=handler.timeout) > lease_until

    def _lease_covers(self, item, handler) -> bool:
        """Extend the lease when the rest of the batch used it up; False if the item is no longer ours."""
        if not self._outlasts(handler, item.lease_until):
            return True
        lease_until = clock.utcnow() + timedelta(seconds=handler.timeout + self.runtime.settings.lease_margin)
        if self._transaction(lambda s: self.store.extend(s, item, lease_until)):
            return True
        self.stats.lease_lost += 1
        log.warning("%s lease-lost before start (another run holds it)", self._describe(item))
        return False

    def _ack_with_session(self, item, handler, ctx: Context, outcome: Outcome) -> Outcome:
        """Commit the handler's writes and its ack together, or neither."""
        transaction = ctx.transaction
        if transaction.session.failed_with is not None:
            ctx.discard_session()
            return Outcome(ERROR, outcome.seconds, f"the handler left ctx.session failed (call rollback() after "
                                                   f"catching a database error): {transaction.session.failed_with}")
        self._bound_lock_waits()
        waiting_since = time.monotonic()
        try:
            if self.store.ack(transaction.session, [item.id], item.claim_token, clock.utcnow()) != 1:
                ctx.discard_session()
                self.stats.lease_lost += 1
                self._log(item, handler, "lease-lost", outcome, "lease expired before the ack; rolled back")
                return Outcome("lease-lost", outcome.seconds)
            crash_point("before-ack-commit")
            transaction.commit()
            crash_point("after-ack-commit")
        except Exception as exc:  # the handler's writes failed at commit (constraint, conflict): a failed attempt
            ctx.discard_session(invalidate=True)
            if isinstance(exc, OperationalError) and is_lock_conflict(exc):
                waited = time.monotonic() - waiting_since
                error = lock_wait_error("the ack", waited)
                log.warning("%s: %s", self._describe(item), error)
                return Outcome(ERROR, outcome.seconds, error)
            return Outcome(ERROR, outcome.seconds, f"commit failed: {describe(exc, 950)}")
        self.stats.done += 1
        self._log(item, handler, "done", outcome)
        return outcome

    def _flush(self, quiet_acks: QuietAcks, *, best_effort: bool = False) -> None:
        if not quiet_acks:
            return
        items = quiet_acks.take()
        crash_point("before-ack-commit")
        waiting_since = time.monotonic()
        try:
            acked = self._transaction(lambda s: self._ack(s, items, clock.utcnow()), ack=True)
        except Exception as exc:
            if isinstance(exc, OperationalError) and is_lock_conflict(exc) and not best_effort:
                self._acks_blocked(items, time.monotonic() - waiting_since)
                return
            if not best_effort:
                raise
            log.warning("%s: could not ack %d finished items; they will run again", self.kind, len(items))
            return
        crash_point("after-ack-commit")
        self._acked(items, acked)

    def _acks_blocked(self, items: list, waited: float) -> None:
        """The acks of finished items waited for a lock until the run's time ran out: each item's
        attempt fails, naming the lock wait (recorded if its row can be written by then; if not,
        LockStillHeld stops the run and its lease expires)."""
        error = lock_wait_error("the ack", waited)
        log.warning("%s: %d finished items not acked: %s", self.kind, len(items), error)
        for item in items:
            self._after_failure(item, self._handler(item), Outcome(ERROR, 0.0, error))

    def _ack(self, session, items: list, now: datetime) -> int:
        """The items done, one UPDATE per claim token (the items acked together may come from more
        than one claim). Returns how many were still ours."""
        ids: dict[str, list[int]] = {}
        for item in items:
            ids.setdefault(item.claim_token, []).append(item.id)
        return sum(self.store.ack(session, token_ids, token, now) for token, token_ids in ids.items())

    def _acked(self, items: list, acked: int) -> None:
        """Counters and log lines of a committed ack."""
        self.stats.done += acked
        self.stats.lease_lost += len(items) - acked
        for item in items:
            self._log(item, self._handler(item), "done", None)
        if acked != len(items):
            log.warning("%s: %d of %d acks found their lease expired (another run may repeat them)",
                        self.kind, len(items) - acked, len(items))

    def _write(self, group: CommitGroup | None, work: Callable[[Session], bool]) -> bool:
        """A write of the processor's: in its own short transaction, or in the group's."""
        return self._transaction(work) if group is None else work(group.session)

    def _transaction(self, work: Callable[[Session], object], *, ack: bool = False):
        """A write of the run in its own short transaction: its lock waits end with the run, and lock
        conflicts are retried while the run has time (outbox.core.lock_wait). An ack waits once: if
        another transaction holds its rows that long, the attempt fails, naming the wait, and that
        failure's record is what waits on (until the run's end)."""
        budget = self._budget
        deadline = None
        if budget is not None and budget.max_time is not None:
            deadline = time.monotonic() + max(budget.remaining(), 0.0)
        return in_transaction(self.sessions, work, deadline=deadline, before_attempt=self._bound_lock_waits,
                              retry_waits=not ack)

    def _bound_lock_waits(self) -> None:
        if self.connection is not None and self._budget is not None:
            bound_lock_wait(self.connection, self._budget.remaining())

    @staticmethod
    def _then(group: CommitGroup | None, report: Callable[[], None]) -> None:
        """Counters and log lines of a write: now, or once the group's COMMIT made it true."""
        if group is None:
            report()
        else:
            group.after_commit.append(report)

    def _after_failure(self, item, handler, outcome: Outcome, group: CommitGroup | None = None) -> None:
        now = clock.utcnow()
        if outcome.kind == RETRY_LATER:
            next_at = self._retry_later_at(item, handler, outcome, now)
            if next_at is not None:
                def reschedule(session):
                    if not self.store.reschedule(session, item, next_at, None, True):
                        return False
                    self._on_retry_later(session, item, handler, outcome, now)
                    return True

                held = self._write(group, reschedule)

                def report():
                    if self._lease_held(held, item, handler, outcome):
                        self.stats.deferred += 1
                        self._log(item, handler, "retry-later", outcome)

                self._then(group, report)
                return
            # Given up as a RetryLater, which uses no attempt (nor does a refusal before the call):
            # the claim's attempt is given back, as a reschedule would.
            self._give_up(item, handler, Outcome(PERMANENT, outcome.seconds, f"{outcome.error}; retry_until has passed"),
                          group, refund_attempt=True)
            return
        next_at = self._retry_at(item, handler, outcome, now)
        if next_at is None:
            self._give_up(item, handler, outcome, group)
            return
        held = self._write(group, lambda s: self.store.reschedule(s, item, next_at, outcome.error, False))

        def report():
            if self._lease_held(held, item, handler, outcome):
                self._retried(item, handler, outcome, next_at, now)

        self._then(group, report)

    @staticmethod
    def _retry_at(item, handler, outcome: Outcome, now: datetime) -> datetime | None:
        """When a failed item is tried again: after the handler's backoff; None to give up (a
        permanent failure, or the last of its attempts)."""
        if outcome.kind == PERMANENT or item.attempts >= handler.max_attempts:
            return None
        return now + timedelta(seconds=handler.backoff.delay(item.attempts))

    def _retried(self, item, handler, outcome: Outcome, next_at: datetime, now: datetime) -> None:
        """Counters and log line of a committed retry."""
        self.stats.retried += 1
        self._log(item, handler, "retry", outcome, f"next in {(next_at - now).total_seconds():.0f}s")

    def _gave_up(self, item, handler, outcome: Outcome, attempt: int) -> None:
        """Counters and log line of a committed give-up (dead / failed) after `attempt` attempts."""
        self.stats.gave_up += 1
        self._log(item, handler, self.gave_up_word, outcome, attempt=attempt)

    def give_up_exhausted(self, item, handler) -> None:
        """Give up, without running it, on an item claimed again after its last attempt was claimed and
        never finished (the process was killed, or its lease ran out): dead / failed. This claim counted
        one more attempt, which never runs: the give-up takes it back in the same UPDATE, so the row
        (`queue failed`, `outbox dead`, the console), its error and the log line all say the attempts
        that ran (issue 35: a `tries=3` job showed `attempts 4` beside "attempt 3 of 3")."""
        self._give_up(item, handler, Outcome(
            "exhausted", 0.0, f"gave up: attempt {item.attempts - 1} of {handler.max_attempts} was claimed but "
                              "never finished (process killed or lease expired)"), refund_attempt=True)

    def _give_up(self, item, handler, outcome: Outcome, group: CommitGroup | None = None, *,
                 refund_attempt: bool = False) -> None:
        """Dead / failed. refund_attempt: given up on without using an attempt (the claim's is given back
        in the same UPDATE, and the log line says the attempts that ran)."""
        held = self._write(group, lambda s: self.store.give_up(s, item, outcome.error or "failed", outcome.traceback,
                                                               clock.utcnow(), refund_attempt=refund_attempt))
        attempt = item.attempts - 1 if refund_attempt else item.attempts

        def report():
            if self._lease_held(held, item, handler, outcome, attempt=attempt):
                self._gave_up(item, handler, outcome, attempt)

        self._then(group, report)

    def _lease_held(self, held: bool, item, handler, outcome: Outcome, *, attempt: int | None = None) -> bool:
        """A token-guarded update that matched nothing: another run holds the item now; say so."""
        if not held:
            self.stats.lease_lost += 1
            self._log(item, handler, "lease-lost", outcome, "another run holds it now; this outcome is not recorded",
                      attempt=attempt)
        return held

    gave_up_word = "dead"

    def _release(self, items: list, *, best_effort: bool = False) -> None:
        if not items:
            return
        token = items[0].claim_token
        try:
            released = self._transaction(lambda s: self.store.release(s, [i.id for i in items], token, clock.utcnow()))
        except Exception:
            if not best_effort:
                raise
            log.warning("%s: could not release %d claimed items; their leases will expire", self.kind, len(items))
            return
        log.info("%s: released %d claimed but not started", self.kind, released)

    def _log(self, item, handler, outcome_name: str, outcome: Outcome | None, note: str | None = None, *,
             attempt: int | None = None) -> None:
        """One line per outcome; `attempt`: the attempts that ran, when not the claim's count."""
        ms = f"{outcome.seconds * 1000:.1f}" if outcome else "-"
        attempt = item.attempts if attempt is None else attempt
        line = (f"{self._describe(item)} outcome={outcome_name} "
                f"attempt={attempt}/{handler.max_attempts if handler else '?'} trace={item.trace_id} ms={ms}")
        if outcome is not None and outcome.error:
            line += f" error={log_text(outcome.error)!r}"  # the full text is in the item's row
        if note:
            line += f" ({note})"
        if outcome_name == "done":
            log.info(line)
        elif outcome_name in (self.gave_up_word,):
            log.error(line)
        else:
            log.warning(line)

