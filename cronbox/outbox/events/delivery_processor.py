"""The delivery rows' processor: in-process consumers run one by one, and the writes every
delivery's outcome goes through (forwarded ones too).

`DeliveryProcessor` is the Processor (outbox.engine.processor) of the delivery family: its store
is outbox.events.deliveries, its handlers the registered consumers, called with the Event and a
Context. The relay (outbox.events.relay) hands it the claimed deliveries of in-process consumers
to run. The forwarder (outbox.events.forwarder) has no handler to call, only outcomes to record:
it records them through the methods below, so a forwarded delivery is acked, retried, given up
on and logged exactly as an in-process consumer's is (one state model, one set of counters).
"""
from __future__ import annotations

from datetime import datetime
from typing import Callable

from cronbox.outbox.core import clock
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.payload import load_payload
from cronbox.outbox.core.text import NAME_MAX, clean_text
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.context import Context, Event
from cronbox.outbox.engine.handler_call import Outcome
from cronbox.outbox.engine.processor import Processor
from cronbox.outbox.events import deliveries


class DeliveryProcessor(Processor):
    kind = "delivery"
    gave_up_word = "dead"
    store = deliveries

    def __init__(self, runtime):
        super().__init__(runtime)
        self.registry = runtime.consumers

    def run(self, budget: Budget, work: Callable[[], int]) -> int:
        """Run `work` (a relay run) on one connection, its transactions' lock waits and retries
        bounded by `budget` (as the processor bounds its own)."""
        self._budget = budget
        return self.on_one_connection(work)

    # -- the writes of a delivery's outcome (the relay's claim, the forwarder's confirms) ----------

    def transaction(self, work: Callable, *, ack: bool = False):
        """`work(session)` in a short transaction of the run, retried on lock conflicts while it has time."""
        return self._transaction(work, ack=ack)

    def ack(self, session, items: list, now: datetime) -> int:
        """The items done, in the caller's transaction (one UPDATE per claim token); how many were still ours."""
        return self._ack(session, items, now)

    def acked(self, items: list, acked: int) -> None:
        """Counters and log lines once an ack committed."""
        self._acked(items, acked)

    def ack_now(self, items: list) -> None:
        """Ack `items` in a transaction of their own."""
        crash_point("before-ack-commit")
        acked = self.transaction(lambda s: self.ack(s, items, clock.utcnow()), ack=True)
        crash_point("after-ack-commit")
        self.acked(items, acked)

    def failed(self, item, consumer, outcome: Outcome) -> None:
        """A failed attempt: retried after the consumer's backoff, or dead after its last attempt."""
        self._after_failure(item, consumer, outcome)

    def lease_covers(self, item, consumer) -> bool:
        """Extend the lease if the consumer's timeout would outlast it; False if it is no longer ours."""
        return self._lease_covers(item, consumer)

    def release(self, items: list, *, best_effort: bool = False) -> None:
        """Give back claimed deliveries not started (their attempt not counted)."""
        self._release(items, best_effort=best_effort)

    # -- Processor hooks -----------------------------------------------------------
    def _handler(self, item):
        return self.registry.get(item.consumer)

    def _args(self, item, ctx: Context) -> tuple:
        return (Event(item.event_id, item.event_type, item.key, load_payload(item.payload), item.created_at), ctx)

    def _describe(self, item) -> str:
        return (f"delivery={item.id} consumer={item.consumer} event={item.event_id} "
                f"type={clean_text(item.event_type, NAME_MAX)}")
