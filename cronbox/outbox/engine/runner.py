"""Running claimed batches: one runner for every family and every claim source (the relay's fan-out
and claim, the worker's claim, `amqp work`'s take all hand it a claimed batch).

For each claimed item, in claim order:
1. stop if the budget says so, giving back (releasing) what was claimed but not started;
2. admission (outbox.engine.admission): an item that does not fit the run's remaining time or memory
   is given back without using an attempt;
3. make sure the lease still covers the handler's timeout, extending it if the batch took long (a
   lease that ran out could let another run start the same item);
4. give up at once on an item whose attempts are used up (a crash mid-attempt: outcomes.exhausted);
5. the family's gate, if it has one (jobs: channel pause, concurrency slot, cost budgets, rate
   limit: outbox.queue.job_family.JobGate), may refuse the call (RetryLater, no attempt used);
6. call the handler with a fresh Context, then
   - success with ctx.session used: the ack joins the handler's transaction (exactly once:
     outbox.engine.settle; the handler's session only ever holds savepoints in it);
   - success without it: the ack is batched with the others (nothing to protect), written at the
     batch's end, or once handlers ran CRONBOX_ACK_FLUSH since (QuietAcks: what a crash repeats);
   - RetryLater, failure: retry, or give up (dead / failed) by the family's rules.
Every outcome is written through the family's Outcomes (outbox.engine.outcomes): token-guarded, a
lost lease rolled back and logged. Whatever a handler raises or returns ends as that item's outcome
(outbox.engine.handler_call); if even recording it fails for a reason other than the database going
away, a plain ASCII error is recorded instead, so one bad item never stops the run.

Consecutive items of grouped handlers (`grouped=True`) run in one transaction instead (`_run_group`;
the group's transaction and rules: outbox.engine.group_commit); a group that cannot commit hands its
members back to this loop, to run again one per transaction.

What one batch needs while it runs (its budget, the item after the current one, the quiet acks,
whether the current handler started, a job slot handed to the next job) is a `Batch`, made per
claimed batch: the runner itself keeps only what outlives batches (admission's profiles).
"""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import is_connection_lost, is_lock_conflict
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.logs import log_text
from cronbox.outbox.core import sealing
from cronbox.outbox.core.sealing import SealError
from cronbox.outbox.core.text import describe
from cronbox.outbox.engine.admission import NEVER_FITS_DELAY, Admission
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.context import Context
from cronbox.outbox.engine.group_commit import CULPRIT, FAILED, CommitGroup, may_join
from cronbox.outbox.engine.handler_call import ERROR, RETRY_LATER, TIMEOUT, Outcome, call_handler
from cronbox.outbox.engine.handler_process import SignalDispositions
from cronbox.outbox.engine.outcomes import LEASE_LOST, Outcomes, exhausted, outlasts

log = logging.getLogger("cronbox")


class QuietAcks:
    """Finished items whose handlers wrote nothing: acked together in one statement, before the
    earliest of their leases runs out, and once handlers ran `window` seconds (CRONBOX_ACK_FLUSH)
    since the first of them started. A run killed before their ack runs them all again once their
    leases end, repeating whatever they did outside the database: the window bounds that repeat to
    the items finished in its last `window` of handler time (and the one in hand), while fast
    items still share one UPDATE per batch. Handler time, not wall time: the repeats are handler
    calls, and a loaded machine stretching the runner's own steps does not split a batch."""

    __slots__ = ("window", "items", "earliest_lease", "handler_seconds")

    def __init__(self, window: float):
        self.window = window
        self.items: list = []
        self.earliest_lease = None
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


class Batch:
    """One claimed batch while the runner works through it."""

    __slots__ = ("work", "index", "budget", "quiet", "alone", "started", "handover", "signals")

    def __init__(self, claimed: list, budget: Budget, ack_flush: float):
        self.work = list(claimed)  # a lost group puts its members back here, to run alone
        self.index = 0  # the item in hand
        self.budget = budget
        self.quiet = QuietAcks(ack_flush)
        self.alone: set[int] = set()  # ids of a lost group's members, run one per transaction now
        self.started = False  # has the current item's handler been called?
        self.handover = None  # the gate's: a finished job's concurrency slot kept for the next job
        # The signal dispositions put back after each handler call (outbox.engine.handler_process),
        # read once for the batch: between its calls only the runner's own writes run.
        self.signals = SignalDispositions() if threading.current_thread() is threading.main_thread() else None

    @property
    def upcoming(self):
        """The item after the one in hand, if any."""
        return self.work[self.index + 1] if self.index + 1 < len(self.work) else None


class Gate(Protocol):
    """A family's checks before a handler is called (jobs: outbox.queue.job_family.JobGate)."""

    def groupable(self, item, handler) -> bool:
        """May the item run in a commit group (which runs no gate)?"""

    def check(self, item, handler, batch: Batch) -> Outcome | None:
        """Before the call: None lets it run; an Outcome (RetryLater, a permanent failure) is the
        item's instead of a call."""

    def holds_until_ack(self, item, batch: Batch) -> bool:
        """Does the finished item hold something others wait for until its ack (a concurrency slot
        the next item does not take over)? Its ack is then written at once, not batched."""

    def closed(self, batch: Batch) -> None:
        """The batch is over (or failed): let go of what the gate kept for it."""


class Runner:
    """Runs a family's claimed batches through its outcomes (see the module's docstring)."""

    def __init__(self, runtime, outcomes: Outcomes, *, gate: Gate | None = None):
        self.runtime = runtime
        self.outcomes = outcomes
        self.family = outcomes.family
        self.db = outcomes.db
        self.gate = gate
        self.admission = Admission(self.family.kind, runtime.settings)  # profiles: checked before, recorded after

    @property
    def stats(self):
        return self.outcomes.stats

    # -- the round's connection -----------------------------------------------------
    @contextmanager
    def holding(self) -> Iterator[Connection]:
        """The round's connection (outbox.engine.connection), held until the block ends, the handler
        profiles written once at its end."""
        with self.db.held() as connection:
            try:
                yield connection
            finally:
                self._profiles(lambda: self.admission.flush(self.db.sessions, force=True))

    def on_one_connection(self, budget: Budget, run: Callable[[], int]) -> int:
        """Run a round (claims and batches) on one held connection, its writes bounded by `budget`."""
        self.db.budget = budget
        with self.holding():
            return run()

    # -- a batch ------------------------------------------------------------------
    def process(self, claimed: list, budget: Budget) -> int:
        """Run a claimed batch (see the module's docstring); how many items were handled."""
        batch = Batch(claimed, budget, self.runtime.settings.ack_flush)
        try:
            # What the batch seals or opens besides its claimed payloads (a sealed job's result, a sealed
            # chain's next row, a handler's own dispatch()) under the run's keys too, with or without an
            # app context (outbox.core.sealing.current: an app context's own sealer still comes first).
            with sealing.using(self.runtime.sealer()):
                return self._process(batch)
        except OperationalError as exc:
            if not is_lock_conflict(exc):
                raise
            # A write of the run waited for a lock until the run's time was up (outbox.core.lock_wait):
            # what it could not record, and what it could not give back, is retried by a later run
            # once its lease expires. The run stops; it never waits past its time.
            log.error("%s: stopping the run: a write still waited for a lock another transaction holds when the "
                      "run's time ran out (%s); items not recorded run again when their leases expire",
                      self.family.kind, log_text(describe(exc, 200)))
            budget.stop("lock-wait")
            self.db.bound_lock_waits()  # 1 s, the run's time being up: its last writes wait no longer
            return 0
        finally:
            self.outcomes.closed()
            if self.gate is not None:
                self.gate.closed(batch)

    def _process(self, batch: Batch) -> int:
        # The profiles are read (again once a minute) when there is work to admit, between the claim's
        # transaction and the first item's: a run that finds nothing due never reads them.
        self.db.budget = budget = batch.budget
        work, quiet = batch.work, batch.quiet
        if work:
            self._profiles(lambda: self.admission.start(self.db.sessions))
            self.db.bound_lock_waits()
        handled = 0
        while batch.index < len(work):
            index = batch.index
            item = work[index]
            if index and budget.stop_reason() is not None:
                self.outcomes.release(work[index:])
                break
            try:
                handler = self.family.handler(item)  # None: not registered here (any more)
                deferred = self._deferred(item, handler, budget)
            except BaseException:  # its release or wait not written: as for an item never started
                self._flush(quiet, best_effort=True)
                self.outcomes.release(work[index:], best_effort=True)
                raise
            if deferred:
                batch.index += 1
                continue
            if item.id not in batch.alone and self._groupable(item, handler, item.claim_token):
                self._flush(quiet)  # its own transaction: before the group opens one on the connection
                handled += self._run_group(batch)
                continue
            batch.started = False
            try:
                try:
                    ran = self._run_one(item, handler, batch)
                except Exception as exc:
                    # Recording what the handler did failed: unless the database went away, one
                    # item must not stop the run (or crash every later one on the same item).
                    if (not batch.started or is_connection_lost(exc) or is_lock_conflict(exc)
                            or not self.outcomes.record_plain_error(item, exc)):
                        raise
                    ran = True
            except BaseException:
                # Database gone, or an interrupt: ack what finished, give back what never started
                # (this item too, if it failed before its handler was called).
                self._flush(quiet, best_effort=True)
                self.outcomes.release(work[index + (1 if batch.started else 0):], best_effort=True)
                raise
            handled += ran
            batch.index += 1
        self._flush(quiet)
        self._profiles(lambda: self.admission.flush(self.db.sessions))
        return handled

    def _flush(self, quiet: QuietAcks, *, best_effort: bool = False) -> None:
        """Ack the quiet items (`best_effort`: the run is ending on an error; if this fails too they
        run again once their leases end)."""
        if not quiet:
            return
        items = quiet.take()
        try:
            self.outcomes.ack_now(items, fail_blocked=not best_effort)
        except Exception:
            if not best_effort:
                raise
            log.warning("%s: could not ack %d finished items; they will run again", self.family.kind, len(items))

    # -- admission ---------------------------------------------------------------------
    def _deferred(self, item, handler, budget: Budget) -> bool:
        """Admission (outbox.engine.admission) before the item starts: True when it was given back,
        without using an attempt: released, the run stopping (it fits a later run), or waiting
        NEVER_FITS_DELAY (it fits no run like this one)."""
        if handler is None or exhausted(item, handler):
            return False
        verdict = self.admission.check(handler.name, budget)
        if verdict is None:
            return False
        if verdict.later:
            log.warning("%s deferred: %s; given back, stopping the run", self.family.describe(item), verdict.reason)
            self.outcomes.release([item])
            self.stats.deferred += 1
            budget.stop(verdict.stop)
        else:
            log.warning("%s never fits: %s; waiting %.0fs (no attempt used)", self.family.describe(item),
                        verdict.reason, NEVER_FITS_DELAY)
            self.outcomes.failed(item, handler, Outcome(RETRY_LATER, 0.0, f"never fits: {verdict.reason}",
                                                        retry_in=NEVER_FITS_DELAY))
        return True

    def _profiles(self, work: Callable[[], None]) -> None:
        """Reading and writing profiles is best effort: an estimate never fails a run."""
        try:
            work()
        except Exception as exc:
            log.warning("%s: handler profiles not read/written (%s)", self.family.kind, log_text(describe(exc, 200)))

    # -- one item -----------------------------------------------------------------
    def _context(self, item, group: CommitGroup | None = None) -> Context:
        # The random trace id makes the key unique for good: SQLite (and MySQL 5.7 after a restart)
        # hands out a pruned row's id again, and keys outlive their rows (notifications, send attempts).
        return Context(attempt=item.attempts, trace_id=item.trace_id,
                       idempotency_key=f"{self.family.kind}-{item.id}-{item.trace_id}",
                       connection=self.db.connection, settings=self.runtime.settings, commit_group=group)

    def _call(self, item, handler, ctx: Context, batch: Batch) -> Outcome:
        """The handler's call, measured into its profile and the budget; what it returned kept for the
        item's ack as the family says (Outcomes.returned)."""
        budget = batch.budget
        try:
            args = self.family.args(item, ctx)
        except SealError as exc:
            # A sealed payload (or flow) that does not open: altered, moved from another row, table or
            # database, or its key missing. This item's failure, recorded by its policy with the reason
            # in its one outcome line; its row stays as it is, and the run goes on with the next item.
            return Outcome(ERROR, 0.0, describe(exc))
        probe = self.admission.probe()
        outcome = call_handler(handler.fn, args, timeout=handler.timeout, scope=self.runtime.scope_for(ctx),
                               dispositions=batch.signals)
        budget.record(outcome.seconds, self.admission.record(handler.name, probe, outcome.seconds))
        return self.outcomes.returned(item, outcome)

    def _run_one(self, item, handler, batch: Batch) -> bool:
        outcomes, quiet = self.outcomes, batch.quiet
        if handler is None:  # not registered here any more: give the lease back
            outcomes.release([item])
            return False
        if quiet.due or (quiet and outlasts(handler, quiet.earliest_lease)):
            # Ack them while their leases still hold, or another run repeats them; and before a crash
            # would repeat more than the window's worth of them.
            self._flush(quiet)
        if not outcomes.lease_covers(item, handler):
            return False
        if exhausted(item, handler):
            outcomes.give_up_exhausted(item, handler)
            return True
        crash_point("after-claim")
        ctx = self._context(item)
        gate = self.gate
        try:
            outcome = gate.check(item, handler, batch) if gate is not None else None
            if outcome is None:
                batch.started = True
                outcome = self._call(item, handler, ctx, batch)
            if outcome.ok and not ctx.session_used:
                quiet.add(item, outcome.seconds)
                # A due ack frees a held slot too: no handover to the next job (holds_until_ack) then.
                if quiet.due or (gate is not None and gate.holds_until_ack(item, batch)):
                    self._flush(quiet)
                return True
            quiet.ran(outcome.seconds)
            if outcome.ok:
                outcome = outcomes.ack_with(item, handler, ctx, outcome)
                if outcome.ok or outcome.kind == LEASE_LOST:
                    return True
            else:
                ctx.discard_session(invalidate=outcome.kind == TIMEOUT)
        finally:
            ctx.discard_session()  # whatever happened, the handler's transaction is over before the next write
        outcomes.failed(item, handler, outcome)
        return True

    # -- group commit (outbox.engine.group_commit) ---------------------------------------
    def _groupable(self, item, handler, token: str) -> bool:
        """May this item join a group? (group_commit.may_join, and the gate's say: a gated item runs alone.)"""
        return (self.db.connection is not None and may_join(item, handler, token, self.runtime.settings)
                and (self.gate is None or self.gate.groupable(item, handler)))

    def _run_group(self, batch: Batch) -> int:
        """Run the batch's item in hand, then the grouped items after it, in one transaction (see
        CommitGroup); the members to run again alone go back into the batch in their place. Returns
        the items handled."""
        settings, work, start, budget = self.runtime.settings, batch.work, batch.index, batch.budget
        group = CommitGroup(self.db.connection, work[start].claim_token)
        ran: list = []  # members whose handler was called, in order
        culprit = None  # (item, handler, outcome) whose own timeout lost the group
        # The group's acks commit at its end: it stays open no longer than CRONBOX_ACK_FLUSH either.
        deadline = clock.monotonic() + min(settings.group_ms / 1000, settings.ack_flush)
        index = start
        self.db.group = group
        try:
            while index < len(work) and len(ran) < settings.group_max and not group.lost:
                item = work[index]
                handler = self.family.handler(item)
                # No member joins once the group's time is up: a lock a member took is held at most
                # CRONBOX_GROUP_MS plus the run of the member running then (never cut short: a
                # timer firing mid-query costs the connection, and then every member's work).
                if ran and (clock.monotonic() >= deadline or budget.stop_reason() is not None
                            or not self._groupable(item, handler, group.token)
                            or self.admission.check(handler.name, budget) is not None):  # _process defers it
                    break
                index += 1
                crash_point("after-claim")
                ctx = self._context(item, group)
                outcome = self._call(item, handler, ctx, batch)
                ran.append(item)
                end, outcome = group.ended(item, ctx, outcome)
                if end == CULPRIT:
                    culprit = (item, handler, outcome)
                elif end == FAILED:
                    try:  # its retry or give-up, written in the group's transaction
                        self.outcomes.failed(item, handler, outcome, group)
                    except Exception as exc:
                        group.lost = group.lost or f"could not record a failure: {describe(exc, 200)}"
            if not group.lost:
                self._commit_group(group)
        except BaseException:
            # An interrupt or a crash-like failure: nothing of the group committed; give every
            # member and the rest back (attempts refunded), as for items never started.
            self.db.group = None
            group.close()
            self.outcomes.release(work[start:], best_effort=True)
            raise
        self.db.group = None
        if group.lost is None:
            batch.index = index
            return len(ran)
        group.close()
        rerun = [item for item in ran if culprit is None or item is not culprit[0]]
        log.warning("%s: group of %d lost (%s); %d run again one per transaction", self.family.kind, len(ran),
                    group.lost, len(rerun))
        work[start:index] = rerun  # the next item is at `start` again
        batch.alone.update(i.id for i in rerun)
        if culprit is not None:
            self.outcomes.failed(*culprit)  # its own timeout: its attempt counts, in a transaction of its own
            return 1
        return 0

    def _commit_group(self, group: CommitGroup) -> None:
        """Commit the group (CommitGroup.commit), or, when no member wrote, ack the members alone (as
        QuietAcks); then the counters and log lines its COMMIT made true."""
        items = group.acks
        if group.outer is None:
            if items:
                self.outcomes.ack_now(items, note="grouped")
        else:
            now = clock.utcnow()
            acked = group.commit(lambda session: self.outcomes.ack(session, items, now))
            if group.lost:
                return
            self.outcomes.acked(items, acked, "grouped")
        group.close()
        for report in group.after_commit:
            report()
