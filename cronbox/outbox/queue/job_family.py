"""The job family, for the runner and the outcomes (outbox.engine.runner, outbox.engine.outcomes):
what the database worker (outbox.queue.worker) and `amqp work` (outbox.queue.broker_worker) share.

A job's handler is the `@job` registered under its name, called with its payload and a Context; its
rows' writes are outbox.queue.jobstore's (or `amqp work`'s store, which gives an unstarted job back to
the broker). Beside that:
- RetryLater may postpone a job until its retry_until: the last wait is cut to that deadline, and a
  RetryLater at or after it fails the job ("retry_until has passed"); a ChannelPaused records the
  channel's pause in the same transaction (`on_retry_later`);
- the pre-call gate (`JobGate`): before a handler starts, one short transaction checks what is
  shared by every worker: the channel's pause, a slot of the job's concurrency group, its queue's and
  group's cost budgets, the rate limit (outbox.queue.pauses, groups, ratelimit). All or nothing: a
  refusal rolls back what the earlier checks took, and the job waits (RetryLater, no attempt used)
  while the worker goes on with its batch. Most jobs have no check and pay nothing for the feature;
- the slot a job's attempt holds is freed in the transaction of its outcome (`Slots`, joined to the
  outcomes: the slot is free exactly when the outcome is recorded; if that transaction never
  commits, the slot's lease frees it), or handed over to the next job of the batch in the same group.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.sealing import JOBS, open_payload
from cronbox.outbox.core.text import shown_name
from cronbox.outbox.engine.connection import RunConnection
from cronbox.outbox.engine.handler_call import PERMANENT, RETRY_LATER, Outcome
from cronbox.outbox.engine.outcomes import Family, LeaseStore, Outcomes
from cronbox.outbox.engine.runner import Batch, Runner
from cronbox.outbox.queue import batches, groups, jobstore, pauses, results

log = logging.getLogger("cronbox")


def job_runner(runtime, store: LeaseStore | None = None) -> Runner:
    """A worker's runner of claimed jobs: the job family, its outcomes through `store` (default: the
    jobs table's, JobStore) with the slots freed in their transactions, and the gate."""
    db = RunConnection(runtime)
    slots = Slots()
    outcomes = Outcomes(job_family(runtime), store or JobStore(runtime.settings), db, joined=(slots,))
    return Runner(runtime, outcomes, gate=JobGate(runtime, db, slots))


def idempotency_ttl(settings) -> float:
    """CRONBOX_IDEMPOTENCY_TTL in seconds: how long a finished job keeps its idempotency key."""
    return settings.duration("CRONBOX_IDEMPOTENCY_TTL", jobstore.IDEMPOTENCY_TTL_DEFAULT, bounds=(1.0, 366 * 86400.0),
                             why="1s and 366d")


class JobStore:
    """jobstore's writes of a job's outcomes (outbox.engine.outcomes.LeaseStore) with this runtime's
    retentions (issue 39): an ack keeps the results it carries CRONBOX_RESULT_TTL, and a finished
    job its idempotency key CRONBOX_IDEMPOTENCY_TTL (read once, a bad setting refused before any claim)."""

    reschedule = staticmethod(jobstore.reschedule)
    release = staticmethod(jobstore.release)
    extend = staticmethod(jobstore.extend)

    def __init__(self, settings):
        self.keep = results.ttl(settings)
        self.key_ttl = idempotency_ttl(settings)

    def ack(self, session, items: list, token: str, now: datetime, values: dict | None = None) -> int:
        return jobstore.ack(session, items, token, now, values, keep=self.keep, key_ttl=self.key_ttl)

    def give_up(self, session, item, error: str, traceback: str | None, now: datetime, *,
                refund_attempt: bool = False) -> bool:
        return jobstore.give_up(session, item, error, traceback, now, refund_attempt=refund_attempt,
                                key_ttl=self.key_ttl)


def job_args(item, ctx, runtime=None) -> tuple:
    """A job handler's arguments: its payload (a sealed one opened under `runtime`'s keys,
    outbox.core.sealing) and ctx, with ctx.batch (a member's batch, a callback's) and ctx.previous (a
    chain step's previous result) for jobs of a batch or chain (issue 39)."""
    if item.batch_id is not None or item.flow is not None:
        batches.attach(ctx, item, runtime)
    return (open_payload(runtime, JOBS, item.handler, item.seal_id, item.payload, ctx.connection), ctx)


def job_family(runtime) -> Family:
    registry = runtime.jobs
    result_max = results.max_bytes(runtime.settings)

    def on_retry_later(session, item, outcome: Outcome, now: datetime) -> None:
        if isinstance(outcome.raised, pauses.ChannelPaused):
            pause = outcome.raised
            pauses.pause(session, pause.channel, pause.seconds, pause.pause_reason, now)
            for listener in runtime.registry.pause_listeners:  # e.g. the channels' admin alert
                listener(session, runtime.settings, pause.channel, pause.seconds, pause.pause_reason)

    return Family("job", "failed", handler=lambda item: registry.get(item.handler),
                  args=lambda item, ctx: job_args(item, ctx, runtime),
                  describe=lambda item: f"job={item.id} queue={item.queue} handler={shown_name(item.handler)}",
                  retry_later_at=retry_later_at, on_retry_later=on_retry_later,
                  keep_value=lambda value: results.encode(value, result_max))  # issue 39: the job's result


def retry_later_at(item, outcome: Outcome, now: datetime) -> datetime | None:
    """RetryLater may postpone a job until its retry_until: the last wait is cut to that deadline,
    and a RetryLater at or after it fails the job (None)."""
    next_at = now + timedelta(seconds=outcome.retry_in or 0)
    if item.retry_until is None:
        return next_at
    if now >= item.retry_until:
        return None
    return min(next_at, item.retry_until)


class Slots:
    """The concurrency-group slots this worker's attempts hold, freed in the transaction of each of
    their outcomes (outbox.engine.outcomes.Joined), their leases following the job's."""

    def __init__(self):
        self.held: dict[int, tuple[str, str]] = {}  # job id -> (group, holder): this worker's attempts holding a slot
        self.leases: dict[int, datetime] = {}  # job id -> its lease, when extended after the claim

    def ended(self, session, items: list, values) -> None:
        if self.held:
            held = [self.held[item.id] for item in items if item.id in self.held]
            if held:
                groups.release(session, held)

    def extended(self, session, item, lease_until: datetime, held: bool) -> None:
        self.leases[item.id] = lease_until
        if held and item.id in self.held:
            groups.extend(session, *self.held[item.id], lease_until)

    def clear(self) -> None:
        """The batch is over: its slots were freed with their outcomes, or are left to their leases."""
        self.held.clear()
        self.leases.clear()


class _Refused(CronboxError):
    """A pre-call check said wait: raised to roll back what the checks before it took."""

    def __init__(self, seconds: float, reason: str):
        super().__init__(reason)
        self.seconds, self.reason = seconds, reason


def concurrency_group_of(item, handler) -> str | None:
    return item.concurrency_group or handler.concurrency_group


class JobGate:
    """The job's pre-call checks (see the module's docstring): the runner's Gate for jobs."""

    def __init__(self, runtime, db: RunConnection, slots: Slots):
        self.runtime = runtime
        self.db = db
        self.slots = slots
        self.registry = runtime.jobs
        self.budgets = groups.budgets(runtime.settings)  # a bad setting: SettingsError before any claim
        self.full_group_wait = groups.full_wait(runtime.settings)
        # group -> (monotonic time until which it is known full, why): later jobs of the same group
        # wait as long as the refused one without asking the database again.
        self.full: dict[str, tuple[float, str]] = {}

    def gated(self, item, handler) -> bool:
        """Has this job a pre-call check? (Not most jobs: they pay nothing for the feature.)"""
        return (handler.channel is not None or handler.rate_limit is not None or item.concurrency_group is not None
                or handler.concurrency_group is not None
                or (bool(self.budgets) and (("queue", item.queue) in self.budgets
                                            or ("group", concurrency_group_of(item, handler)) in self.budgets)))

    def groupable(self, item, handler) -> bool:
        # A grouped job runs no pre-call check; one with a budget (a setting job() cannot see) runs alone.
        return not self.gated(item, handler)

    def holds_until_ack(self, item, batch: Batch) -> bool:
        """A finished job's slot is freed with its ack at once (others may be waiting for it), unless
        the next job of the batch is of the same concurrency group: then that job's gate takes the
        slot over and this ack is batched as usual (one commit per job instead of two)."""
        held = self.slots.held.get(item.id)
        if held is None:
            return False
        upcoming = batch.upcoming
        if upcoming is not None and upcoming.claim_token == item.claim_token:
            upcoming_handler = self.registry.get(upcoming.handler)
            if (upcoming_handler is not None
                    and concurrency_group_of(upcoming, upcoming_handler) == held[0]):
                batch.handover = held
                return False
        return True

    def closed(self, batch: Batch) -> None:
        self._let_go(batch)
        self.slots.clear()

    def _let_go(self, batch: Batch) -> None:
        """A slot kept for a next job that did not take it: freed now (its ack would free it too, but
        perhaps only after other jobs ran). Best effort: its lease is the safety net."""
        handover, batch.handover = batch.handover, None
        if handover is not None:
            try:
                self.db.transaction(lambda s: groups.release(s, [handover]))
            except Exception:
                log.warning("job: could not free the slot of group %s; its lease will", handover[0])

    def check(self, item, handler, batch: Batch) -> Outcome | None:
        concurrency_group = concurrency_group_of(item, handler)
        if batch.handover is not None and batch.handover[0] != concurrency_group:
            self._let_go(batch)
        outcome = self._gate(item, handler, concurrency_group, batch)
        if outcome is not None or concurrency_group is None:
            self._let_go(batch)  # refused (the gate's transaction rolled the handover back), or none taken
        batch.handover = None  # taken over, in the gate's committed transaction
        return outcome

    def _gate(self, item, handler, concurrency_group: str | None, batch: Batch) -> Outcome | None:
        if not self.gated(item, handler):
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
        handover = batch.handover[1] if batch.handover is not None else None
        if handover is None and concurrency_group is not None and concurrency_group in self.full:
            until, reason = self.full[concurrency_group]
            if clock.monotonic() < until:
                return Outcome(RETRY_LATER, 0.0, reason, retry_in=until - clock.monotonic())
            del self.full[concurrency_group]
        holder = groups.holder_of(item)
        settings = self.runtime.settings

        def gate(session) -> None:
            now = clock.utcnow()
            if handler.channel is not None:
                wait = pauses.remaining(session, handler.channel, now)
                if wait is not None:
                    raise _Refused(wait, f"channel {handler.channel} is paused")
            if concurrency_group is not None:
                # The job's own lease: the slot frees itself when the job may be claimed again.
                lease = self.slots.leases.get(item.id, item.lease_until)
                wait = groups.take(session, concurrency_group, limit, holder, lease, now,
                                   max_wait=self.full_group_wait, handover=handover)
                if wait is not None:
                    reason = f"concurrency group {concurrency_group} is full ({limit} running)"
                    self.full[concurrency_group] = (clock.monotonic() + wait, reason)
                    raise _Refused(wait, reason)
            for b in spend:
                wait = b.charge(session, cost, now)
                if wait is not None:
                    raise _Refused(wait, f"cost budget of {b.scope} {b.name} ({b.spec}) spent")
            rate = handler.rate_limit(settings) if callable(handler.rate_limit) else handler.rate_limit
            if rate is not None:
                wait = rate.acquire(session, now)
                if wait is not None:
                    raise _Refused(wait, f"rate limit {rate.bucket} reached")

        try:
            self.db.transaction(gate)
        except _Refused as refused:  # rolled back: nothing taken, nothing spent
            return Outcome(RETRY_LATER, 0.0, refused.reason, retry_in=refused.seconds)
        if concurrency_group is not None:
            self.slots.held[item.id] = (concurrency_group, holder)
        return None

