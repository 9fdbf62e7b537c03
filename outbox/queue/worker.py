"""The job worker: claim due jobs queue by queue in strict priority order, run them, ack or retry.

Run from cron with --stop-when-empty (or inside the tick). Limits (--max-time,
--max-jobs, --memory, a signal) are checked between jobs, never by killing one;
what was claimed but not started is released at once.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Callable

from outbox.core import clock
from outbox.core.db import in_transaction
from outbox.core.payload import load_payload
from outbox.engine.budget import Budget
from outbox.engine.context import Context
from outbox.engine.handler_call import RETRY_LATER, Outcome
from outbox.engine.processor import Processor
from outbox.engine.registry import Jobs
from outbox.queue import jobstore, pauses

log = logging.getLogger("cronbox")


class Worker(Processor):
    kind = "job"
    gave_up_word = "failed"
    store = jobstore

    def __init__(self, runtime, queues: list[str] | None = None, *, batch_size: int = 100,
                 before_batch: Callable[[], None] | None = None):
        super().__init__(runtime)
        self.registry: Jobs = runtime.jobs
        self.fixed_queues = queues  # None: the runtime's default order, re-read each run
        self.batch_size = batch_size
        self.before_batch = before_batch

    def run(self, budget: Budget) -> int:
        """Run jobs until none is due or the budget says stop; returns the number of jobs handled."""
        return self.on_one_connection(lambda: self._run(budget))

    @property
    def queues(self) -> list[str]:
        return self.fixed_queues or self.runtime.default_queues()

    def _run(self, budget: Budget) -> int:
        handled = 0
        while budget.stop_reason() is None:
            if self.before_batch is not None:
                self.before_batch()
            claimed = self._claim_highest(budget.batch_size(self.batch_size))
            if not claimed:
                break
            handled += self.process(claimed, budget)
        return handled

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

        return in_transaction(self.sessions, claim)

    # -- Processor hooks -----------------------------------------------------------
    def _handler(self, item):
        return self.registry.get(item.handler)

    def _args(self, item, ctx: Context) -> tuple:
        return (load_payload(item.payload), ctx)

    def _describe(self, item) -> str:
        return f"job={item.id} queue={item.queue} handler={item.handler}"

    def _before_call(self, item, handler) -> Outcome | None:
        if handler.channel is None and handler.rate_limit is None:
            return None

        def gate(session) -> tuple[float, str] | None:
            now = clock.utcnow()
            if handler.channel is not None:
                wait = pauses.remaining(session, handler.channel, now)
                if wait is not None:
                    return wait, f"channel {handler.channel} is paused"
            limit = handler.rate_limit(self.runtime.settings) if callable(handler.rate_limit) else handler.rate_limit
            if limit is not None:
                wait = limit.acquire(session, now)
                if wait is not None:
                    return wait, f"rate limit {limit.bucket} reached"
            return None

        waiting = in_transaction(self.sessions, gate)
        if waiting is None:
            return None
        seconds, reason = waiting
        return Outcome(RETRY_LATER, 0.0, reason, retry_in=seconds)

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
