"""A batch and a chain spanning two runners (tests/processes/test_batch_broker_runners.py): queue "mixmq",
forwarded to RabbitMQ ("<TEST_BROKER_PREFIX>.mixmq") and run by `amqp work`; its database-side jobs, on
queue "mixdb" run by `queue work`, are tests.handlers.batch_broker_db's. The tick, which publishes
mixmq's jobs, loads this module alone: it knows no mixdb job, so it runs none.

Every job records its effect with the process kind that ran it (TEST_RUNNER), as "<what>@<runner>":
members return their number; the batch's `then` (here, on the broker's side) records the sum of its
members' results, or "early-then" if it ran before the batch finished; chain steps check that
ctx.previous is the step before's result."""
from __future__ import annotations

import os

from sqlalchemy import insert

import cronbox
from tests.handlers.effects import effects

_prefix = os.environ.get("TEST_BROKER_PREFIX", "cronbox-test")
cronbox.forward_jobs("mixmq", broker_queue=f"{_prefix}.mixmq", republish_after=15)


def record(what: str, n: int, ctx) -> None:
    ctx.session.execute(insert(effects).values(consumer=f"{what}@{os.environ.get('TEST_RUNNER', '?')}", event_id=n))


def member_and_step(queue: str, side: str):
    """The member job and the chain step job of one side ("mq" here, "db" in batch_broker_db) on `queue`:
    a member records its number and returns it; step `payload` (1, 2, 3) checks that ctx.previous is
    the step before's number, records it and returns its own."""
    @cronbox.job(queue, name=f"mix.{side}_member", tries=5, timeout=10)
    def member(payload, ctx):
        record("member", payload, ctx)
        return payload

    @cronbox.job(queue, name=f"mix.{side}_step", tries=5, timeout=10)
    def step(payload, ctx):
        expected = None if payload == 1 else payload - 1
        if ctx.previous != expected:
            raise cronbox.PermanentFailure(f"step {payload} got {ctx.previous!r}, not {expected!r}")
        record(f"step{payload}", payload, ctx)
        return payload

    return member, step


mq_member, mq_step = member_and_step("mixmq", "mq")


@cronbox.job("mixmq", name="mix.then", tries=5, timeout=10)
def then(payload, ctx):
    progress = ctx.batch.progress(ctx.session)
    total = sum(value for _job_id, value in ctx.batch.results(ctx.session))
    early = progress.pending != 0 or progress.finished_at is None or progress.done != progress.total
    record("early-then" if early else "then", total, ctx)
