"""The relay: fan events out to consumers, claim due deliveries, call consumers in-process or
forward them to a broker.

A claimed batch splits in two. Deliveries of in-process consumers run one by one through the
Processor (a Python function per delivery). Deliveries of forward targets (outbox.forward) are
published per target as one batch with publisher confirms (outbox.events.broker); each one is then
acked if the broker confirmed it, or retried with the target's backoff. Claiming, leases, per-key
order and retries are the same for both: a claim takes at most one delivery per (consumer, key),
so a message that failed stays pending and holds its key back until it gets through.
"""
from __future__ import annotations

import logging
from typing import Callable

from outbox.core import clock
from outbox.core.db import in_transaction
from outbox.core.faults import crash_point
from outbox.core.payload import load_payload
from outbox.engine.budget import Budget
from outbox.engine.context import Context, Event
from outbox.engine.handler_call import ERROR, Outcome, describe
from outbox.engine.processor import Processor, QuietAcks
from outbox.events import deliveries
from outbox.events.broker import Broker, Outgoing
from outbox.events.forward import ForwardTarget, is_forward, message_properties

log = logging.getLogger("cronbox")

FAN_OUT_BATCH = 500


class Relay(Processor):
    kind = "delivery"
    gave_up_word = "dead"
    store = deliveries

    def __init__(self, runtime, *, batch_size: int = 100, before_batch: Callable[[], None] | None = None,
                 broker: Broker | None = None):
        super().__init__(runtime)
        self.registry = runtime.consumers
        self.batch_size = batch_size
        self.before_batch = before_batch
        self._warned: set[str] = set()
        self._broker = broker

    @property
    def broker(self) -> Broker:
        """The process's broker connection, made on the first forwarded batch."""
        if self._broker is None:
            self._broker = Broker(self.runtime.settings.get("CRONBOX_AMQP_URL"))
        return self._broker

    def close(self) -> None:
        """At the end of the run: close the broker connection, if one was opened."""
        if self._broker is not None:
            self._broker.close()

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

    def process(self, claimed: list, budget: Budget) -> int:
        forwarded = [item for item in claimed if is_forward(self.registry.get(item.consumer))]
        if not forwarded:
            return super().process(claimed, budget)
        local = [item for item in claimed if not is_forward(self.registry.get(item.consumer))]
        try:
            handled = self._forward(forwarded, budget)
        except BaseException:
            self._release(local, best_effort=True)
            raise
        return handled + (super().process(local, budget) if local else 0)

    # -- forwarding ----------------------------------------------------------------
    def _forward(self, items: list, budget: Budget) -> int:
        """Publish each target's deliveries as one confirmed batch: a target whose exchange is
        missing (the broker closes the channel) fails alone, not every other target's batch."""
        groups: dict[str, list] = {}
        for item in items:
            groups.setdefault(item.consumer, []).append(item)
        handled = 0
        names = list(groups)
        for index, name in enumerate(names):
            if handled and budget.stop_reason() is not None:
                self._release([i for n in names[index:] for i in groups[n]])
                break
            handled += self._forward_batch(self.registry.get(name), groups[name], budget)
        return handled

    def _forward_batch(self, target: ForwardTarget, items: list, budget: Budget) -> int:
        live, messages = [], []
        for item in items:
            if not self._lease_covers(item, target):
                continue
            if item.attempts > target.max_attempts:
                self._give_up(item, target, Outcome(
                    "exhausted", 0.0, f"gave up: attempt {item.attempts - 1} of {target.max_attempts} was claimed "
                                      "but never finished (process killed or lease expired)"))
                continue
            try:
                # A routing-key function sees the event as a consumer would; a fixed key needs no parse.
                payload = load_payload(item.payload) if callable(target.target.routing_key) else None
                event = Event(item.event_id, item.event_type, item.key, payload, item.created_at)
                messages.append(Outgoing(target.target.exchange, target.target.key_for(event),
                                         item.payload.encode("utf-8"), message_properties(item)))
            except Exception as exc:  # a routing_key function that raised, or a payload it could not read
                self._after_failure(item, target, Outcome(ERROR, 0.0, f"no routing key: {describe(exc, 900)}"))
                continue
            live.append(item)
        if not live:
            return len(items)
        crash_point("after-claim")
        started = clock.monotonic()
        # Never past the run's end: the tick must exit by --max-time even if the broker stalls.
        wait = max(1.0, min(target.timeout, budget.remaining() if budget.max_time is not None else target.timeout))
        results = self.broker.send(messages, wait)
        seconds = (clock.monotonic() - started) / len(live)
        for _ in live:
            budget.record(seconds)
        confirmed = QuietAcks()
        for item, error in zip(live, results):
            if error is None:
                confirmed.add(item)
        self._flush(confirmed)  # first: the broker has these, the sooner acked the fewer duplicates
        for item, error in zip(live, results):
            if error is not None:
                self._after_failure(item, target, Outcome(ERROR, seconds, error))
        return len(items)

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
