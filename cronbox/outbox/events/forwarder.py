"""The forwarder: a forward target's claimed deliveries published to the broker, each acked once
the broker confirmed it.

A forward target (`cronbox.forward`) is a consumer whose "handler" is a publisher. Its deliveries are
ordinary delivery rows, claimed by the relay like every other consumer's (outbox.events.relay,
deliveries.claim_due); this module takes over from there, per target and claimed batch:

1. each delivery's lease must still cover the target's timeout (extended if the batch took long);
   one whose attempts are used up (its run was killed mid-publish) is given up on
   (outbox.engine.outcomes.exhausted);
2. its message is made (the routing key, forward.message_of) and the batch is published with
   publisher confirms in one go (outbox.amqp.broker.Broker.send), waiting for every confirm;
3. the confirmed deliveries are kept in `confirmed`, to be acked by claim token in the relay's
   next transaction (the one that also fans out and claims the next batch: one COMMIT a batch),
   or in one of their own (`ack_confirmed`) before anything that may wait (another target's
   publish, in-process handlers, the end of the run);
4. a failed one (unroutable, refused, no confirm in time, broker unreachable) is retried with the
   target's backoff, or dead after its last attempt, as any consumer's failure is.
Every outcome is written through the relay's Outcomes (outbox.engine.outcomes), the in-process
consumers' own.

Nothing is acked before its confirm: a run killed in between leaves the delivery leased, and the
claim takes it again once its lease runs out (published again, with the same message id).
"""
from __future__ import annotations

import logging

from cronbox.outbox.core import clock
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.payload import dump_payload, load_payload
from cronbox.outbox.core.sealing import EVENTS, is_sealed, open_payload
from cronbox.outbox.core.text import describe
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.context import Event
from cronbox.outbox.engine.handler_call import ERROR, Outcome
from cronbox.outbox.engine.outcomes import Outcomes, exhausted
from cronbox.outbox.amqp.broker import Broker, Outgoing
from cronbox.outbox.events.deliveries import Claimed
from cronbox.outbox.events.forward import INSTALL_HEADER, ForwardTarget, message_of

log = logging.getLogger("cronbox")

MAX_ROUTING_KEY = 255  # an AMQP short string


class Forwarder:
    def __init__(self, runtime, outcomes: Outcomes, broker: Broker | None = None):
        self.runtime = runtime
        self.outcomes = outcomes
        self._broker = broker
        self.confirmed: list[Claimed] = []  # confirmed by the broker, not yet acked

    @property
    def broker(self) -> Broker:
        """The process's broker connection, made on the first forwarded batch."""
        if self._broker is None:
            self._broker = Broker(self.runtime.settings.get("CRONBOX_AMQP_URL"))
        return self._broker

    def keep_alive(self) -> None:
        """Between runs (each poll of the tick's linger): heartbeats, a dead connection dropped."""
        if self._broker is not None:
            self._broker.keep_alive()

    def close(self) -> None:
        """At the end of the run: close the broker connection, if one was opened."""
        if self._broker is not None:
            self._broker.close()

    def forward(self, items: list[Claimed], budget: Budget) -> None:
        """Publish the claimed deliveries of forward targets, one confirmed batch per target: a
        target whose exchange is missing (the broker closes the channel) fails alone."""
        by_target: dict[str, list[Claimed]] = {}
        for item in items:
            by_target.setdefault(item.consumer, []).append(item)
        names = list(by_target)
        for index, name in enumerate(names):
            publishing = False
            try:
                if index:
                    if budget.stop_reason() is not None:
                        self.outcomes.release([i for n in names[index:] for i in by_target[n]])
                        return
                    self.ack_confirmed()  # the previous target's: not left waiting on this publish
                publishing = True
                self._publish(self.runtime.consumers.get(name), by_target[name], budget)
            except BaseException:  # targets not yet published are given back, not left leased
                unstarted = names[index + 1:] if publishing else names[index:]
                self.outcomes.release([i for n in unstarted for i in by_target[n]], best_effort=True)
                raise

    def ack_confirmed(self, *, best_effort: bool = False) -> None:
        """Ack the confirmed deliveries in a transaction of their own (`best_effort`: a run ending
        on an error; if this fails too, their leases expire and they are published again)."""
        confirmed, self.confirmed = self.confirmed, []
        if not confirmed:
            return
        try:
            self.outcomes.ack_now(confirmed, fail_blocked=not best_effort)
        except Exception:
            if not best_effort:
                raise
            log.warning("relay: could not ack %d forwarded deliveries the broker confirmed; their leases will "
                        "expire and they are published again", len(confirmed))

    def _publish(self, target: ForwardTarget, items: list[Claimed], budget: Budget) -> None:
        ready, messages = [], []
        for item in items:
            if not self.outcomes.lease_covers(item, target):
                continue
            if exhausted(item, target):
                self.outcomes.give_up_exhausted(item, target)
                continue
            try:
                messages.append(message_for(target, item, self.runtime, self.outcomes.db.connection))
            except Exception as exc:  # a routing_key function that raised, or a payload it could not read
                self.outcomes.failed(item, target, Outcome(ERROR, 0.0, f"no routing key: {describe(exc, 900)}"))
                continue
            ready.append(item)
        if not ready:
            return
        crash_point("after-claim")
        started = clock.monotonic()
        # Never past the run's end: the tick must exit by --max-time even if the broker stalls.
        wait = max(1.0, min(target.timeout, budget.remaining() if budget.max_time is not None else target.timeout))
        results = self.broker.send(messages, wait)
        seconds = (clock.monotonic() - started) / len(ready)
        for _ in ready:
            budget.record(seconds)
        failed = [(item, error) for item, error in zip(ready, results) if error is not None]
        self.confirmed += [item for item, error in zip(ready, results) if error is None]
        if failed:
            self.ack_confirmed()  # first: the broker has these, the sooner acked the fewer duplicates
        for item, error in failed:
            self.outcomes.failed(item, target, Outcome(ERROR, seconds, error))


def message_for(target: ForwardTarget, item: Claimed, runtime=None, connection=None) -> Outgoing:
    """The message of a claimed delivery, with its routing key: the event type, the target's fixed
    key, or what its function makes of the event (which sees the event as a consumer would). A
    sealed payload is opened (in memory) only for a key function or a target forwarding it open."""
    routing_key = target.target.routing_key
    opened: list = []

    def payload():
        if not opened:
            opened.append(open_payload(runtime, EVENTS, item.event_type, item.seal_id, item.payload, connection)
                          if is_sealed(item.payload)
                          else load_payload(item.payload))
        return opened[0]

    if routing_key is None:
        key = item.event_type
    elif isinstance(routing_key, str):
        key = routing_key
    else:
        key = target.target.key_for(Event(item.event_id, item.event_type, item.key, payload(), item.created_at))
    if len(key.encode("utf-8", "surrogatepass")) > MAX_ROUTING_KEY:
        raise ValueError(f"the routing key is longer than AMQP's {MAX_ROUTING_KEY} bytes: {key[:40]!r}...")
    if target.open and is_sealed(item.payload):
        return message_of(target.target.exchange, key, item, dump_payload(payload()))
    message = message_of(target.target.exchange, key, item)
    sealer = runtime.sealer() if runtime is not None and is_sealed(item.payload) else None
    if sealer is not None and connection is not None:  # `amqp consume` with the same keys opens it
        message.properties["application_headers"][INSTALL_HEADER] = sealer.install_id(connection).hex()
    return message
