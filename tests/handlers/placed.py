"""One handlers module as the README sets it up: a forward target and the consumer it feeds, in one
process and one database (CRONBOX_HANDLERS=tests.handlers.placed). TEST_RUNS says where the consumer
runs ("tick", "broker", "both"; unset: unsaid, which both commands refuse)."""
from __future__ import annotations

import os

from sqlalchemy import insert

import cronbox
from tests.handlers.consuming import consumed

cronbox.forward("placed.*", exchange=os.environ.get("TEST_AMQP_EXCHANGE", "unset"), name="placed.forward",
               timeout=5, backoff=[0.2])


@cronbox.consumer("placed.paid", name="placed.consumer", runs=os.environ.get("TEST_RUNS") or None, timeout=10)
def placed_consumer(event, ctx):
    ctx.session.execute(insert(consumed).values(consumer="placed.consumer", n=event.payload["n"], attempt=ctx.attempt))
