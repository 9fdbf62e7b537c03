"""The job worker: claim due jobs queue by queue in strict priority order, run them, ack or retry.

Run from cron with --stop-when-empty (or inside the tick). Limits (--max-time,
--max-jobs, --memory, a signal) are checked between jobs, never by killing one;
what was claimed but not started is released at once.

Before a handler starts, one short transaction checks what is shared by every worker: the channel's
pause, a slot of the job's concurrency group, its queue's and group's cost budgets, the rate limit
(outbox.queue.pauses, groups, ratelimit). All or nothing: a refusal rolls back what the earlier checks
took, and the job waits (RetryLater, no attempt used) while the worker goes on with its batch.
"""
from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Callable

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.payload import load_payload
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.context import Context
from cronbox.outbox.engine.handler_call import PERMANENT, RETRY_LATER, Outcome
from cronbox.outbox.engine.processor import Processor
from cronbox.outbox.engine.registry import Jobs
from cronbox.outbox.queue import batches, groups, jobstore, pauses, results

log = logging.getLogger("cronbox")
# A pool child's empty claim while due jobs exist (a sibling's claim holds their rows): look again
# this many times, this far apart, before ending as "empty".
SIBLING_RETRIES = 5
SIBLING_PAUSE = 0.05


def idempotency_ttl(settings) -> float:
    """CRONBOX_IDEMPOTENCY_TTL in seconds: how long a finished job keeps its idempotency key."""
    return settings.duration("CRONBOX_IDEMPOTENCY_TTL", jobstore.IDEMPOTENCY_TTL_DEFAULT, bounds=(1.0, 366 * 86400.0),
                             why="1s and 366d")


class _Refused(CronboxError):
    """A pre-call check said wait: raised to roll back what the checks before it took."""

    def __init__(self, seconds: float, reason: str):
        super().__init__(reason)
        self.seconds, self.reason = seconds, reason


class SlotStore:
    """jobstore's writes for the processor, each also freeing the concurrency-group slot its job's
    attempt holds, in the same transaction: the slot is free exactly when the outcome is recorded.
    (If that transaction never commits, the slot's lease frees it.)"""

    def __init__(self, settings=None):
        self.held: dict[int, tuple[str, str]] = {}  # job id -> (group, holder): this worker's attempts holding a slot
        self.leases: dict[int, datetime] = {}  # job id -> its lease, when extended after the claim
        # Issue 39: the batch's claimed rows and their handlers' results, for the acks' follow-ups
        # (results, batches, chains: jobstore.ack); the retentions read once.
        self.follow = jobstore.Follow()
        if settings is not None:
            self.follow.keep = results.ttl(settings)
            self.follow.key_ttl = idempotency_ttl(settings)

    def _free(self, session, ids) -> None:
        held = [self.held[i] for i in ids if i in self.held]
        if held:
            groups.release(session, held)

    def ack(self, session, ids, token, now):
        acked = jobstore.ack(session, ids, token, now, self.follow)
        self._free(session, ids)
        return acked

    def reschedule(self, session, item, next_at, error, refund_attempt):
        held = jobstore.reschedule(session, item, next_at, error, refund_attempt)
        self._free(session, [item.id])
        return held

    def give_up(self, session, item, error, traceback, now, *, refund_attempt=False):
        held = jobstore.give_up(session, item, error, traceback, now, refund_attempt=refund_attempt,
                                key_ttl=self.follow.key_ttl)
        self._free(session, [item.id])
        return held

    def release(self, session, ids, token, now):
        released = jobstore.release(session, ids, token, now)
        self._free(session, ids)
        return released

    def extend(self, session, item, lease_until):
        held = jobstore.extend(session, item, lease_until)
        self.leases[item.id] = lease_until
        if held and item.id in self.held:
            groups.extend(session, *self.held[item.id], lease_until)
        return held


class Worker(Processor):
    kind = "job"
    gave_up_word = "failed"
    store = jobstore

    def __init__(self, runtime, queues: list[str] | None = None, *, batch_size: int = 100,
                 before_batch: Callable[[], None] | None = None, siblings: bool = False):
        super().__init__(runtime)
        self.siblings = siblings  # a pool child: an empty claim may be a sibling's claim in progress
        self.registry: Jobs = runtime.jobs
        self.fixed_queues = queues  # None: the runtime's default order, re-read each run
        self.batch_size = batch_size
        self.before_batch = before_batch
        self.store = SlotStore(runtime.settings)
        self.result_max = results.max_bytes(runtime.settings)
        self.budgets = groups.budgets(runtime.settings)  # a bad setting: SettingsError before any claim
        self.full_group_wait = groups.full_wait(runtime.settings)
        # group -> (monotonic time until which it is known full, why): later jobs of the same group in
        # a batch wait as long as the refused one without asking the database again.
        self._full: dict[str, tuple[float, str]] = {}
        self._handover: tuple[str, str] | None = None  # (group, holder): a finished job's slot for the next job

    def run(self, budget: Budget) -> int:
        """Run jobs until none is due or the budget says stop; returns the number of jobs handled."""
        return self.on_one_connection(lambda: self._run(budget))

    @property
    def queues(self) -> list[str]:
        return self.fixed_queues or self.runtime.default_queues()

    def _run(self, budget: Budget) -> int:
        self._budget = budget  # the claims' lock waits and retries end with the run (Processor._transaction)
        handled = 0
        busy = 0
        while budget.stop_reason() is None:
            if self.before_batch is not None:
                self.before_batch()
            claimed = self._claim_highest(budget.batch_size(self.batch_size))
            if not claimed:
                if self.siblings and busy < SIBLING_RETRIES and self._due_but_taken():
                    busy += 1
                    time.sleep(SIBLING_PAUSE)
                    continue
                break
            busy = 0
            handled += self.process(claimed, budget)
            del claimed  # the batch's payloads go before the next claim reads more
        return handled

    def _due_but_taken(self) -> bool:
        """After an empty claim in a pool child: are there due jobs all the same? A sibling's claim in
        progress holds row locks on the jobs it is taking, and SKIP LOCKED (or the token path's
        guarded UPDATE) passes over them and whatever else its scan locked, so a child starting at
        the same moment as two others can find nothing although a backlog waits. Ended as "empty",
        it would leave that backlog to the siblings' next batches, one child short for the rest of
        the run. A plain read (no locks): one statement, paid only after an empty claim."""
        now = clock.utcnow()
        return bool(self._transaction(lambda s: jobstore.due_queues(
            s, self.registry, self.queues, now, always_ask=True)))

    def process(self, claimed, budget: Budget) -> int:
        self.store.follow.items.update((item.id, item) for item in claimed)  # issue 39: for the acks' follow-ups
        try:
            return super().process(claimed, budget)
        finally:
            self._let_go()
            self.store.held.clear()  # freed with their outcomes, or left to their leases
            self.store.leases.clear()
            self.store.follow.items.clear()
            self.store.follow.values.clear()

    def _claim_highest(self, limit: int) -> list[jobstore.ClaimedJob]:
        """Strict priority: a batch comes from the first queue (in --queue order) that has due jobs,
        asked in one statement (jobstore.due_queues); the claims follow in the same short transaction."""
        mode = self.runtime.claim_mode()
        margin = self.runtime.settings.lease_margin

        def claim(session) -> list[jobstore.ClaimedJob]:
            now = clock.utcnow()
            for queue in jobstore.due_queues(session, self.registry, self.queues, now):
                claimed = jobstore.claim_due(session, self.registry, queue, now=now, limit=limit, mode=mode,
                                             lease_margin=margin)
                if claimed:
                    return claimed
            return []

        return self._transaction(claim)

    # -- Processor hooks -----------------------------------------------------------
    def _handler(self, item):
        return self.registry.get(item.handler)

    def _args(self, item, ctx: Context) -> tuple:
        if item.batch_id is not None or item.flow is not None:
            batches.attach(ctx, item)  # issue 39: ctx.batch, ctx.previous
        return (load_payload(item.payload), ctx)

    def _returned(self, item, outcome: Outcome) -> Outcome:
        """Issue 39: a handler's return value, as JSON for its ack to store (jobstore.ack); one that is not
        JSON, or over CRONBOX_RESULT_MAX, fails the attempt for good (recorded: nothing is lost)."""
        self.store.follow.values.pop(item.id, None)  # an earlier run of it in this batch (a lost group)
        if not outcome.ok or outcome.value is None:
            return outcome
        try:
            self.store.follow.values[item.id] = results.encode(outcome.value, self.result_max)
        except results.ResultError as exc:
            return Outcome(PERMANENT, outcome.seconds, str(exc))
        return outcome

    def _describe(self, item) -> str:
        return f"job={item.id} queue={item.queue} handler={item.handler}"

    def _concurrency_group_of(self, item, handler) -> str | None:
        return item.concurrency_group or handler.concurrency_group

    def _gated(self, item, handler) -> bool:
        """Has this job a pre-call check? (Not most jobs: they pay nothing for the feature.)"""
        return (handler.channel is not None or handler.rate_limit is not None or item.concurrency_group is not None
                or handler.concurrency_group is not None
                or (bool(self.budgets) and (("queue", item.queue) in self.budgets
                                            or ("group", self._concurrency_group_of(item, handler)) in self.budgets)))

    def _groupable(self, item, handler, token: str) -> bool:
        # A grouped job runs no pre-call check; one with a budget (a setting job() cannot see) runs alone.
        return super()._groupable(item, handler, token) and not self._gated(item, handler)

    def _holds_until_ack(self, item) -> bool:
        """A finished job's slot is freed with its ack at once (others may be waiting for it), unless
        the next job of the batch is of the same concurrency group: then that job's gate takes the slot over and
        this ack is batched as usual (one commit per job instead of two)."""
        if item.id not in self.store.held:
            return False
        upcoming, handler = self._upcoming, self._handler(item)
        concurrency_group = self._concurrency_group_of(item, handler)
        if upcoming is not None and upcoming.claim_token == item.claim_token:
            upcoming_handler = self._handler(upcoming)
            if (upcoming_handler is not None
                    and self._concurrency_group_of(upcoming, upcoming_handler) == concurrency_group):
                self._handover = self.store.held[item.id]
                return False
        return True

    def _let_go(self) -> None:
        """A slot kept for a next job that did not take it: freed now (its ack would free it too, but
        perhaps only after other jobs ran). Best effort: its lease is the safety net."""
        handover, self._handover = self._handover, None
        if handover is not None:
            try:
                self._transaction(lambda s: groups.release(s, [handover]))
            except Exception:
                log.warning("job: could not free the slot of group %s; its lease will", handover[0])

    def _before_call(self, item, handler) -> Outcome | None:
        concurrency_group = self._concurrency_group_of(item, handler) if handler is not None else None
        if self._handover is not None and self._handover[0] != concurrency_group:
            self._let_go()
        outcome = self._gate(item, handler, concurrency_group)
        if outcome is not None or concurrency_group is None:
            self._let_go()  # refused (the gate's transaction rolled the handover back), or none taken
        self._handover = None  # taken over, in the gate's committed transaction
        return outcome

    def _gate(self, item, handler, concurrency_group: str | None) -> Outcome | None:
        if not self._gated(item, handler):
            return None
        limit = (handler.concurrency_limit if concurrency_group == handler.concurrency_group
                 else groups.limits(self.registry).get(concurrency_group))
        cost = item.cost or handler.cost
        spend = [b for b in (self.budgets.get(("queue", item.queue)), self.budgets.get(("group", concurrency_group)))
                 if b]
        if concurrency_group is not None and limit is None:
            return Outcome(PERMANENT, 0.0,
                           f"concurrency group {concurrency_group} is not declared by any job registered here")
        for b in spend:
            if cost > b.limit:
                return Outcome(PERMANENT, 0.0, f"cost {cost} is more than the {b.scope} {b.name} budget of "
                                               f"{b.spec}: it can never run")
        handover = self._handover[1] if self._handover is not None else None
        if handover is None and concurrency_group is not None and concurrency_group in self._full:
            until, reason = self._full[concurrency_group]
            if clock.monotonic() < until:
                return Outcome(RETRY_LATER, 0.0, reason, retry_in=until - clock.monotonic())
            del self._full[concurrency_group]
        holder = groups.holder_of(item)

        def gate(session) -> None:
            now = clock.utcnow()
            if handler.channel is not None:
                wait = pauses.remaining(session, handler.channel, now)
                if wait is not None:
                    raise _Refused(wait, f"channel {handler.channel} is paused")
            if concurrency_group is not None:
                # The job's own lease: the slot frees itself when the job may be claimed again.
                lease = self.store.leases.get(item.id, item.lease_until)
                wait = groups.take(session, concurrency_group, limit, holder, lease, now,
                                   max_wait=self.full_group_wait, handover=handover)
                if wait is not None:
                    reason = f"concurrency group {concurrency_group} is full ({limit} running)"
                    self._full[concurrency_group] = (clock.monotonic() + wait, reason)
                    raise _Refused(wait, reason)
            for b in spend:
                wait = b.charge(session, cost, now)
                if wait is not None:
                    raise _Refused(wait, f"cost budget of {b.scope} {b.name} ({b.spec}) spent")
            rate = handler.rate_limit(self.runtime.settings) if callable(handler.rate_limit) else handler.rate_limit
            if rate is not None:
                wait = rate.acquire(session, now)
                if wait is not None:
                    raise _Refused(wait, f"rate limit {rate.bucket} reached")

        try:
            self._transaction(gate)
        except _Refused as refused:  # rolled back: nothing taken, nothing spent
            return Outcome(RETRY_LATER, 0.0, refused.reason, retry_in=refused.seconds)
        if concurrency_group is not None:
            self.store.held[item.id] = (concurrency_group, holder)
        return None

    def _on_retry_later(self, session, item, handler, outcome: Outcome, now: datetime) -> None:
        if isinstance(outcome.raised, pauses.ChannelPaused):
            pause = outcome.raised
            pauses.pause(session, pause.channel, pause.seconds, pause.pause_reason, now)
            for listener in self.runtime.registry.pause_listeners:  # e.g. the channels' admin alert
                listener(session, self.runtime.settings, pause.channel, pause.seconds, pause.pause_reason)

    def _retry_later_at(self, item, handler, outcome: Outcome, now: datetime) -> datetime | None:
        """RetryLater may postpone a job until its retry_until: the last wait is cut to that
        deadline, and a RetryLater at or after it fails the job ("retry_until has passed")."""
        next_at = now + timedelta(seconds=outcome.retry_in or 0)
        if item.retry_until is None:
            return next_at
        if now >= item.retry_until:
            return None
        return min(next_at, item.retry_until)
