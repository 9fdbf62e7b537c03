"""The delivery family, for the runner and the outcomes (outbox.engine.runner, outbox.engine.outcomes).

A delivery's handler is the consumer registered under its name (a forward target too: the forwarder
records its outcomes through the same Outcomes, so a forwarded delivery is acked, retried, given up
on and logged exactly as an in-process consumer's is: one state model, one set of counters); it is
called with the Event and a Context; its rows' writes are outbox.events.deliveries'. The relay
(outbox.events.relay) makes the pieces for its run: `delivery_runner`.
"""
from __future__ import annotations

from cronbox.outbox.core.sealing import EVENTS, open_payload
from cronbox.outbox.core.text import shown_name
from cronbox.outbox.engine.connection import RunConnection
from cronbox.outbox.engine.context import Context, Event
from cronbox.outbox.engine.outcomes import Family, Outcomes
from cronbox.outbox.engine.runner import Runner
from cronbox.outbox.events import deliveries


def delivery_family(consumers, runtime=None) -> Family:
    """The family of the delivery rows of `consumers` (the runtime's registered consumers); a sealed
    payload is opened under `runtime`'s keys (outbox.core.sealing)."""

    def args(item, ctx: Context) -> tuple:
        payload = open_payload(runtime, EVENTS, item.event_type, item.seal_id, item.payload, ctx.connection)
        return (Event(item.event_id, item.event_type, item.key, payload, item.created_at), ctx)

    def describe(item) -> str:
        return f"delivery={item.id} consumer={item.consumer} event={item.event_id} type={shown_name(item.event_type)}"

    return Family("delivery", "dead", handler=lambda item: consumers.get(item.consumer), args=args, describe=describe)


def delivery_runner(runtime) -> Runner:
    """A relay run's runner of in-process consumers' deliveries; its outcomes (`runner.outcomes`)
    are the forwarder's too."""
    outcomes = Outcomes(delivery_family(runtime.consumers, runtime), deliveries, RunConnection(runtime))
    return Runner(runtime, outcomes)
