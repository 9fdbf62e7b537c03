"""The relay: fan events out to consumers, claim due deliveries, call consumers in-process.

Where a delivery goes is `_args`/`_handler` (today: a Python function in this
process). A transport that publishes to a broker instead would replace those;
claiming, leases and retries stay as they are.
"""
from __future__ import annotations

import logging
from typing import Callable

from outbox.core import clock
from outbox.core.db import in_transaction
from outbox.core.payload import load_payload
from outbox.engine.budget import Budget
from outbox.engine.context import Context, Event
from outbox.engine.processor import Processor
from outbox.events import deliveries

log = logging.getLogger("cronbox")

FAN_OUT_BATCH = 500


class Relay(Processor):
    kind = "delivery"
    gave_up_word = "dead"
    store = deliveries

    def __init__(self, runtime, *, batch_size: int = 100, before_batch: Callable[[], None] | None = None):
        super().__init__(runtime)
        self.registry = runtime.consumers
        self.batch_size = batch_size
        self.before_batch = before_batch
        self._warned: set[str] = set()

    def run(self, budget: Budget) -> int:
        """Relay until nothing is due or the budget says stop; returns deliveries handled + events fanned out."""
        return self.on_one_connection(lambda: self._run(budget))

    def _run(self, budget: Budget) -> int:
        work = 0
        self._warn_unregistered()
        while budget.stop_reason() is None:
            if self.before_batch is not None:
                self.before_batch()  # e.g. RunLock.check: raises LockLost
            fanned = self.fan_out()
            claimed = self.claim(budget.batch_size(self.batch_size))
            if not claimed and not fanned:
                break
            work += fanned + self.process(claimed, budget)
        return work

    def fan_out(self) -> int:
        now = clock.utcnow()
        events, _rows = in_transaction(
            self.sessions, lambda s: deliveries.fan_out(s, self.registry, now, FAN_OUT_BATCH)
        )
        self.stats.fanned += events
        return events

    def claim(self, limit: int) -> list[deliveries.Claimed]:
        mode = self.runtime.claim_mode()
        margin = self.runtime.settings.lease_margin
        return in_transaction(
            self.sessions,
            lambda s: deliveries.claim_due(s, self.registry, now=clock.utcnow(), limit=limit, mode=mode,
                                           lease_margin=margin),
        )

    # -- Processor hooks -----------------------------------------------------------
    def _handler(self, item):
        return self.registry.get(item.consumer)

    def _args(self, item, ctx: Context) -> tuple:
        return (Event(item.event_id, item.event_type, item.key, load_payload(item.payload), item.created_at), ctx)

    def _describe(self, item) -> str:
        return (f"delivery={item.id} consumer={item.consumer} event={item.event_id} type={item.event_type}")

    def _warn_unregistered(self) -> None:
        rows = in_transaction(self.sessions, lambda s: deliveries.unregistered_due(s, self.registry, clock.utcnow()))
        for name, count in rows:
            if name not in self._warned:
                self._warned.add(name)
                log.warning("relay: %d due deliveries for consumer %r, which is not registered in this process "
                            "(check CRONBOX_HANDLERS); they wait", count, name)
