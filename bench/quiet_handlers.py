"""Jobs for bench.bench_ack_flush (CRONBOX_HANDLERS=bench.quiet_handlers): handlers that do not use
ctx.session, so their acks are batched (outbox.engine.runner.QuietAcks). A module of its own, with
nothing newer than cronbox 0.7's public API: the script copies it into the older code it measures as
"before"."""
from __future__ import annotations

import os
import time

import cronbox

QUEUE = "quiet"
SLEEP = 0.05  # seconds: a call to another service


@cronbox.job(QUEUE, name="bench.quiet.noop", timeout=30)
def noop(payload, ctx):
    """Nothing at all: the acks' own cost."""


@cronbox.job(QUEUE, name="bench.quiet.call", timeout=1)
def call(payload, ctx):
    """50 ms, then a line in BENCH_EFFECTS_FILE when it is set (an effect outside the database)."""
    time.sleep(SLEEP)
    effects = os.environ.get("BENCH_EFFECTS_FILE")
    if effects:
        with open(effects, "a") as out:
            out.write(f"{payload['i']}\n")
