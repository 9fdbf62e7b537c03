"""Where a consumer runs: in the tick's process (the relay calls it), off the broker (`amqp consume`
runs it for each message of its type), or both. A consumer's type is matched exactly (no patterns:
those are a forward target's). "both" next to a matching forward target means two runs per event, one
in each place, each with its own idempotency key (the tick's delivery row, `amqp consume`'s inbox row).

    @cronbox.consumer("appointment.paid", name="notify_patient", runs="tick")   # the relay calls it
    @cronbox.consumer("appointment.paid", name="bill", runs="broker")           # amqp consume does
    @cronbox.consumer("appointment.paid", name="keep", runs="both")             # both: twice per event

Unsaid (runs=None) is fine while no forward target in the process matches the consumer's type: there
is nothing to choose between, and each command runs it for the events it sees (the tick the events
recorded here, `amqp consume` the messages of its queue). With a matching forward target the same
event would reach the consumer twice, once from the tick and once off the queue the target feeds
(two rows per event, as the README's set-up did): the tick and `amqp consume` then refuse to start,
with one line naming the consumer and the fix. The relay fans an event out only to consumers that
run in the tick (and forward targets), so no delivery row waits for a broker-only consumer.
"""
from __future__ import annotations

from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.events.forward import is_forward

TICK, BROKER, BOTH = "tick", "broker", "both"
PLACES = (TICK, BROKER, BOTH)


def runs_in_tick(consumer) -> bool:
    """The relay fans out to it (forward targets included: the relay publishes for them)."""
    return is_forward(consumer) or consumer.runs != BROKER


def runs_off_broker(consumer) -> bool:
    """`amqp consume` runs it for the messages of its type."""
    return not is_forward(consumer) and consumer.runs != TICK


def check(consumers) -> None:
    """Refuse a set-up where an event would reach a consumer twice: one whose place is unsaid while a
    forward target of this process matches its type. One line: the first such consumer and the fix."""
    registered = consumers.in_order()  # a Registry's consumers (outbox.engine.registry.Consumers)
    targets = [c for c in registered if is_forward(c)]
    for consumer in registered:
        if is_forward(consumer) or consumer.runs is not None:
            continue
        target = next((t for t in targets if t.matches(consumer.event_type)), None)
        if target is not None:
            raise RegistrationError(
                f"consumer {consumer.name!r} of {consumer.event_type!r} is also forwarded to the broker by "
                f"{target.name!r}: say where it runs, @cronbox.consumer(..., runs=\"tick\") in this process, "
                "runs=\"broker\" off the queue (amqp consume), or runs=\"both\"")
