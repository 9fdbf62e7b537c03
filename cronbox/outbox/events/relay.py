"""The relay: fan events out to their consumers' delivery rows, claim what is due, and hand it on.

One event's path: `record()` (outbox.events.record) writes it in the host's transaction; the
relay's batch transaction fans it out to one pending delivery row per consumer and claims the due
rows (outbox.events.deliveries: fan_out, claim_due); an in-process consumer's delivery is run by the
runner (outbox.engine.runner, with the delivery family: outbox.events.delivery_family), a forward
target's is published by the Forwarder (outbox.events.forwarder) through the Broker
(outbox.amqp.broker) and acked once confirmed; both write its outcome through the same Outcomes
(outbox.engine.outcomes). Claiming, leases, per-key order and retries are the same for every consumer: a claim
takes at most one delivery per (consumer, key), so a delivery that failed stays pending and holds
its key back until it gets through.

Each batch is one transaction: the acks of the forwarded deliveries the broker confirmed in the
batch before, the fan-out of new events, then the claim of what is due, the new rows included
(claimed in id order, so retries and older rows go first; an expired lease is claimed alone).
"""
from __future__ import annotations

import logging
from typing import Callable

from cronbox.outbox.core import clock
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events import deliveries, placement
from cronbox.outbox.amqp.broker import Broker
from cronbox.outbox.events.delivery_family import delivery_runner
from cronbox.outbox.events.forward import is_forward
from cronbox.outbox.events.forwarder import Forwarder

log = logging.getLogger("cronbox")

FAN_OUT_BATCH = 500


class Relay:
    """A relay run: the batches' fan-out and claim here, in-process consumers' deliveries run by
    `runner`, forward targets' published by `forwarder`, every outcome written through `outcomes`,
    whose `stats` count them all."""

    def __init__(self, runtime, *, batch_size: int = 100, before_batch: Callable[[], None] | None = None,
                 broker: Broker | None = None):
        placement.check(runtime.consumers)  # an event must not reach a consumer from here and the broker both
        self.runtime = runtime
        self.registry = runtime.consumers
        self.batch_size = batch_size
        self.before_batch = before_batch
        self.runner = delivery_runner(runtime)
        self.outcomes = self.runner.outcomes
        self.db = self.runner.db
        self.forwarder = Forwarder(runtime, self.outcomes, broker)
        self._warned: set[str] = set()

    @property
    def stats(self):
        return self.outcomes.stats

    @property
    def broker(self) -> Broker:
        return self.forwarder.broker

    def close(self) -> None:
        """At the end of the run: close the broker connection, if one was opened."""
        self.forwarder.close()

    def run(self, budget: Budget) -> int:
        """Relay until nothing is due or the budget says stop; returns deliveries handled + events fanned out."""
        return self.runner.on_one_connection(budget, lambda: self._run(budget))

    def _run(self, budget: Budget) -> int:
        work = 0
        self._warn_unregistered()
        self.forwarder.keep_alive()  # each poll of the linger: heartbeats, a connection found dead
        try:
            while budget.stop_reason() is None:
                if self.before_batch is not None:
                    self.before_batch()  # e.g. RunLock.check: raises LockLost
                fanned, claimed = self._fan_out_and_claim(budget.batch_size(self.batch_size))
                if not claimed and not fanned:
                    break
                work += fanned + self._hand_on(claimed, budget)
                del claimed  # the batch's payloads go before the next claim reads more
        except BaseException:
            self.forwarder.ack_confirmed(best_effort=True)
            raise
        self.forwarder.ack_confirmed()
        return work

    def _fan_out_and_claim(self, limit: int) -> tuple[int, list[deliveries.Claimed]]:
        """The batch's transaction: ack the forwarded deliveries confirmed since the last one (which
        frees their keys for the claim), fan out new events, claim up to `limit` due deliveries.
        Returns (events fanned out, the claimed deliveries)."""
        mode = self.runtime.claim_mode()
        margin = self.runtime.settings.lease_margin
        confirmed = self.forwarder.confirmed

        def batch(session):
            now = clock.utcnow()
            acked = self.outcomes.ack(session, confirmed, now) if confirmed else 0
            events, _rows = deliveries.fan_out(session, self.registry, now, FAN_OUT_BATCH)
            claimed = deliveries.claim_due(session, self.registry, now=now, limit=limit, mode=mode,
                                           lease_margin=margin)
            if confirmed:
                crash_point("before-ack-commit")
            return acked, events, claimed

        acked, events, claimed = self.db.transaction(batch)
        if confirmed:
            crash_point("after-ack-commit")
            self.forwarder.confirmed = []
            self.outcomes.acked(confirmed, acked)
        self.stats.fanned += events
        return events, claimed

    def _hand_on(self, claimed: list, budget: Budget) -> int:
        """Forward targets' deliveries to the forwarder, in-process consumers' to the runner."""
        forwarded = [item for item in claimed if is_forward(self.registry.get(item.consumer))]
        local = [item for item in claimed if not is_forward(self.registry.get(item.consumer))]
        try:
            if forwarded:
                self.forwarder.forward(forwarded, budget)
            if local:
                self.forwarder.ack_confirmed()  # handlers may run long: the confirmed are acked first
        except BaseException:
            self.outcomes.release(local, best_effort=True)
            raise
        return len(forwarded) + (self.runner.process(local, budget) if local else 0)

    def _warn_unregistered(self) -> None:
        rows = self.db.transaction(lambda s: deliveries.unregistered_due(s, self.registry, clock.utcnow()))
        for name, count in rows:
            if name not in self._warned:
                self._warned.add(name)
                log.warning("relay: %d due deliveries for consumer %r, which is not registered in this process "
                            "(check CRONBOX_HANDLERS); they wait", count, name)
