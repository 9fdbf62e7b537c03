"""The job worker: claim due jobs queue by queue in strict priority order, run them, ack or retry.

Run from cron with --stop-when-empty (or inside the tick). Limits (--max-time,
--max-jobs, --memory, a signal) are checked between jobs, never by killing one;
what was claimed but not started is released at once.

Each claimed batch is run by the job family's runner (outbox.engine.runner with
outbox.queue.job_family: the pre-call gate, the slots freed with the outcomes, RetryLater's rules).
"""
from __future__ import annotations

import time
from typing import Callable

from cronbox.outbox.core import clock
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.registry import Jobs
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.job_family import job_runner

# A pool child's empty claim while due jobs exist (a sibling's claim holds their rows): look again
# this many times, this far apart, before ending as "empty".
SIBLING_RETRIES = 5
SIBLING_PAUSE = 0.05


class Worker:
    """The database worker: claims due jobs (the claim source) and hands each batch to the job
    family's runner (outbox.queue.job_family.job_runner)."""

    def __init__(self, runtime, queues: list[str] | None = None, *, batch_size: int = 100,
                 before_batch: Callable[[], None] | None = None, siblings: bool = False):
        self.runtime = runtime
        self.siblings = siblings  # a pool child: an empty claim may be a sibling's claim in progress
        self.registry: Jobs = runtime.jobs
        self.fixed_queues = queues  # None: the runtime's default order, re-read each run
        self.batch_size = batch_size
        self.before_batch = before_batch
        self.runner = job_runner(runtime)
        self.db = self.runner.db

    @property
    def stats(self):
        return self.runner.stats

    def run(self, budget: Budget) -> int:
        """Run jobs until none is due or the budget says stop; returns the number of jobs handled."""
        return self.runner.on_one_connection(budget, lambda: self._run(budget))

    @property
    def queues(self) -> list[str]:
        return self.fixed_queues or self.runtime.default_queues()

    def _run(self, budget: Budget) -> int:
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
            handled += self.runner.process(claimed, budget)
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
        return bool(self.db.transaction(lambda s: jobstore.due_queues(
            s, self.registry, self.queues, now, always_ask=True)))

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

        return self.db.transaction(claim)
