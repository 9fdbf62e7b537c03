"""Handlers that call out without ctx.session, for the crash-window tests
(tests/processes/test_ack_flush_processes.py; CRONBOX_HANDLERS=tests.handlers.quiet).

Each call sleeps TEST_SLEEP seconds, then appends its item (the event id, or the job's payload "n")
to TEST_EFFECTS_FILE: an effect outside the database, as a call to another service is, which a run
killed before the item's ack makes again. Their acks are batched (outbox.engine.runner.QuietAcks).
With TEST_BROKER_PREFIX set, the queue "quiet-broker" is forwarded to the broker queue
"<TEST_BROKER_PREFIX>.quiet", for `amqp work`.
"""
from __future__ import annotations

import os
import time

import cronbox
from cronbox import outbox

TIMEOUT = 1.0  # seconds: the lease is this + CRONBOX_LEASE_MARGIN


def _call(item: int) -> None:
    time.sleep(float(os.environ.get("TEST_SLEEP") or 0))
    with open(os.environ["TEST_EFFECTS_FILE"], "a") as out:
        out.write(f"{item}\n")


@cronbox.consumer("quiet.call", name="quiet.consumer", timeout=TIMEOUT, max_attempts=100)
def quiet_consumer(event, ctx):
    _call(event.id)


@cronbox.job("quiet", name="quiet.job", timeout=TIMEOUT, tries=100)
def quiet_job(payload, ctx):
    _call(payload["n"])


@cronbox.job("quiet-broker", name="quiet.broker_job", timeout=TIMEOUT, tries=100)
def quiet_broker_job(payload, ctx):
    _call(payload["n"])


if os.environ.get("TEST_BROKER_PREFIX"):
    cronbox.forward_jobs("quiet-broker", broker_queue=f"{os.environ['TEST_BROKER_PREFIX']}.quiet")
