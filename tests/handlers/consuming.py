"""Consumers run off RabbitMQ by the `amqp consume` tests (CRONBOX_HANDLERS=tests.handlers.consuming).

Two consumers of "amqp.write", each writing a row of test_consumed (their DB effect) and a line to
TEST_CALLS_FILE per call ("<consumer> <n> <attempt> <time>": an external effect, at least once).
What a call does comes from the payload, so one process can get differently behaving messages:
  "fail": N      consume.a fails its first N attempts
  "permanent": 1 consume.a raises PermanentFailure
  "sleep": S     consume.a sleeps S seconds
  "hold": 1      consume.a writes TEST_INSIDE_FILE, then waits for TEST_RELEASE_FILE (SIGTERM tests:
                 tests.handlers.effects.wait_for_release)
  "kill": 1      consume.a SIGKILLs its own process (a poison message)
Backoff [0.5, 1.0] seconds, 3 attempts, timeout 10 s.
"""
from __future__ import annotations

import os
import signal
import time

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert

import cronbox
from cronbox.outbox.core.faults import crash_point
from tests.handlers.effects import wait_for_release

metadata = MetaData()
consumed = Table("test_consumed", metadata, Column("id", Integer, primary_key=True),
                 Column("consumer", String(64)), Column("n", Integer), Column("attempt", Integer),
                 Column("at", Float))


def _call(name: str, event, ctx) -> None:
    calls = os.environ.get("TEST_CALLS_FILE")
    if calls:
        with open(calls, "a") as out:
            out.write(f"{name} {event.payload.get('n')} {ctx.attempt} {time.time():.3f}\n")
    ctx.session.execute(insert(consumed).values(consumer=name, n=event.payload.get("n"), attempt=ctx.attempt,
                                                at=time.time()))


@cronbox.consumer("amqp.write", name="consume.a", max_attempts=3, backoff=[0.5, 1.0], timeout=10)
def consume_a(event, ctx):
    p = event.payload
    if p.get("hold"):
        wait_for_release()
    time.sleep(p.get("sleep", 0))
    crash_point("in-handler")
    if p.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    _call("consume.a", event, ctx)
    if p.get("permanent"):
        raise cronbox.PermanentFailure("this one cannot work")
    if ctx.attempt <= p.get("fail", 0):
        raise RuntimeError(f"failing attempt {ctx.attempt}")


@cronbox.consumer("amqp.write", name="consume.b", max_attempts=3, backoff=[0.5, 1.0], timeout=10)
def consume_b(event, ctx):
    _call("consume.b", event, ctx)

