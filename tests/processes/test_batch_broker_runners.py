"""A batch and a chain spanning two queues served by different runners (issue 39): "mixdb", run by `queue
work`, and "mixmq", forwarded to RabbitMQ (published by the tick) and run by `amqp work`, each a real
subprocess, on SQLite, MariaDB (both claim modes) and PostgreSQL. Each member is counted by whichever
runner ran it; the batch's `then` (on the broker's queue) and `finally` (on the database's) run once,
after the last member, wherever it ran; the chain goes database → broker → database, each step with
the step before's result. The tick loads only the broker side's jobs, so it runs no mixdb job."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from sqlalchemy import select

import cronbox
from cronbox.outbox.queue.models import Job
from tests.conftest import BACKENDS, run_cli
from tests.handlers import batch_broker as mq, batch_broker_db as db
from tests.handlers.effects import effects, metadata as effects_metadata
from tests.helpers import run_until

pytestmark = pytest.mark.backends(*BACKENDS)

DB_MEMBERS, MQ_MEMBERS = [1, 2, 3, 4], [10, 20, 30]


def effect_counts(runtime) -> Counter:
    with runtime.sessions() as session:
        return Counter((r.consumer, r.event_id) for r in session.execute(select(effects.c.consumer,
                                                                                effects.c.event_id)))


def jobs(runtime) -> list:
    with runtime.sessions() as session:
        return list(session.execute(select(Job.id, Job.handler, Job.status, Job.batch_id, Job.flow, Job.created_at,
                                           Job.finished_at)).all())


def test_a_batch_and_a_chain_spanning_queue_work_and_amqp_work_finish_once(runtime, env, rabbit):
    effects_metadata.create_all(runtime.engine)
    prefix = rabbit.name("jobs")
    rabbit.queues.append(f"{prefix}.mixmq")
    base = {**env, "CRONBOX_AMQP_URL": rabbit.url, "TEST_BROKER_PREFIX": prefix, "CRONBOX_LEASE_MARGIN": "5"}
    both = {**base, "CRONBOX_HANDLERS": "tests.handlers.batch_broker,tests.handlers.batch_broker_db"}
    with runtime.sessions.begin() as session:
        batch = cronbox.batch(session, name="mixed", then=mq.then, finally_=db.finally_, payload=0)
        for n in DB_MEMBERS:
            db.db_member.dispatch(session, n, batch=batch)
        for n in MQ_MEMBERS:
            mq.mq_member.dispatch(session, n, batch=batch)
        chain = cronbox.chain(session, [(db.db_step, 1), (mq.mq_step, 2), (db.db_step, 3)])

    def round_() -> None:
        for args, extra in ((["tick", "--no-linger"], {**base, "CRONBOX_HANDLERS": "tests.handlers.batch_broker"}),
                            (["amqp", "work", "--queue", "mixmq", "--stop-when-empty", "--max-time", "60"], both),
                            (["queue", "work", "--queue", "mixdb", "--stop-when-empty", "--max-time", "60"], both)):
            runner = args[0] if args[0] == "tick" else f"{args[0]}-work"
            proc = run_cli(extra, *args, timeout=180, TEST_RUNNER=runner)
            assert proc.returncode == 0, (args, proc.stdout + proc.stderr)
            assert "Traceback" not in proc.stderr, proc.stderr

    run_until(round_, lambda: all(r.status == "done" for r in jobs(runtime)), pause=0.2, seconds=300)
    effect = effect_counts(runtime)
    assert effect == Counter({**{("member@queue-work", n): 1 for n in DB_MEMBERS},
                              **{("member@amqp-work", n): 1 for n in MQ_MEMBERS},
                              ("then@amqp-work", sum(DB_MEMBERS + MQ_MEMBERS)): 1, ("finally@queue-work", 0): 1,
                              ("step1@queue-work", 1): 1, ("step2@amqp-work", 2): 1, ("step3@queue-work", 3): 1})
    rows = jobs(runtime)
    members = [r for r in rows if r.batch_id == batch.id]
    callbacks = [r for r in rows if r.flow is not None and json.loads(r.flow).get("batch") == batch.id]
    assert sorted(r.handler for r in callbacks) == ["mix.finally", "mix.then"]
    assert {r.created_at for r in callbacks} <= {r.finished_at for r in members}  # a member's outcome transaction
    with runtime.sessions() as session:
        progress, steps = batch.progress(session), chain.progress(session)
    assert (progress.state, progress.done, progress.pending) == ("finished", len(DB_MEMBERS + MQ_MEMBERS), 0)
    assert steps.state == "finished" and [s.handler for s in steps.steps] == ["mix.db_step", "mix.mq_step", "mix.db_step"]
    by_id = {r.id: r for r in rows}
    chained = [by_id[s.job_id] for s in steps.steps]
    for before, after in zip(chained, chained[1:]):
        assert after.created_at == before.finished_at  # dispatched by the step before's outcome transaction
