"""Batches and chains drained by the real runners (issue 39), each a real subprocess: `queue work
--workers 2` (a forked pool of two) and the `tick` (its worker stage), on SQLite, MariaDB (both claim
modes) and PostgreSQL. Every callback exactly once, dispatched by one of its members' outcome
transactions and run after the batch finished; each batch's counters equal its members' rows; every
member's effect once if it is done, never if it was cancelled; each chain step dispatched by the
transaction that made the step before it done, with that step's result.

The batch and chain spanning a database queue (`queue work`) and a queue forwarded to RabbitMQ (`amqp
work`) are in test_batch_broker_runners.py."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from sqlalchemy import select

import cronbox
from cronbox.outbox.queue.batches import CANCELLED_CLASS
from cronbox.outbox.queue.models import Job
from tests.conftest import BACKENDS, run_cli
from tests.handlers import batch_chaos as h
from tests.handlers.effects import effects, metadata as effects_metadata
from tests.helpers import run_until

pytestmark = pytest.mark.backends(*BACKENDS)

RUNNERS = {"pool": ["queue", "work", "--queue", "chaos", "--workers", "2", "--stop-when-empty", "--max-time", "120"],
           "tick": ["tick", "--no-linger", "--max-time", "120"]}
# Per batch: its members (n, quiet, fail, add), allow_failures. Numbers >= 1000 are members a member adds.
BATCHES = [
    ([(0, False, False, ())], False),
    ([(n, n % 3 == 0, False, ()) for n in range(10, 18)], False),
    ([(n, n % 2 == 0, False, ()) for n in range(20, 50)], False),
    ([(50, False, False, (1000, 1001, 1002)), (51, True, False, (1003,))], False),  # members add members
    ([(n, False, n == 62, ()) for n in range(60, 72)], False),  # one fails: catch, the rest cancelled or run
    ([(n, n % 2 == 1, n == 81, ()) for n in range(80, 85)], True),  # one fails, allowed: then too
    ([], False),  # empty: then and finally at its commit
]
CHAINS = [0, 1, 2, 3]  # chain 3's second step fails: its catch, no third step
FAILING_CHAIN = 3


def dispatch(runtime):
    created = []
    with runtime.sessions.begin() as session:
        for b, (members, allow_failures) in enumerate(BATCHES):
            batch = cronbox.batch(session, name=f"runners {b}", then=h.then, catch=h.catch, finally_=h.finally_,
                                  allow_failures=allow_failures, payload=b)
            created.append(batch)
            for n, quiet, fail, add in members:
                h.member.dispatch(session, {"n": n, "quiet": quiet, "fail": fail, "add": list(add)}, batch=batch)
        chains = [cronbox.chain(session, [(h.step1, c), (h.step2, {"c": c, "fail": c == FAILING_CHAIN}),
                                          (h.step3, c)], catch=h.chain_catch) for c in CHAINS]
    return created, chains


def rows(runtime) -> list:
    with runtime.sessions() as session:
        return list(session.execute(select(Job.id, Job.handler, Job.status, Job.error_class, Job.batch_id, Job.flow,
                                           Job.payload, Job.created_at, Job.finished_at)).all())


def effect_counts(runtime) -> Counter:
    with runtime.sessions() as session:
        return Counter((r.consumer, r.event_id) for r in session.execute(select(effects.c.consumer,
                                                                                effects.c.event_id)))


def pending(runtime) -> int:
    return sum(1 for r in rows(runtime) if r.status in ("ready", "reserved"))


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_batches_and_chains_drained_by_a_real_runner_fire_each_callback_once_after_its_last_member(
        runtime, env, runner):
    effects_metadata.create_all(runtime.engine)
    created, chains = dispatch(runtime)
    run_env = {**env, "CRONBOX_HANDLERS": "tests.handlers.batch_chaos", "CRONBOX_LEASE_MARGIN": "10"}

    def run() -> None:
        proc = run_cli(run_env, *RUNNERS[runner], timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        if runner == "pool":
            assert "pool of workers 2" in proc.stdout, proc.stdout

    run_until(run, lambda: pending(runtime) == 0, pause=0.5, seconds=300)
    jobs = rows(runtime)
    by_id = {r.id: r for r in jobs}
    effect = effect_counts(runtime)
    assert not [key for key in effect if key[0].startswith("early-")], effect

    for b, batch in enumerate(created):
        members = [r for r in jobs if r.batch_id == batch.id]
        numbers = sorted(json.loads(r.payload)["n"] for r in members)
        expected = sorted([n for n, *_ in BATCHES[b][0]] + [a for *_, add in BATCHES[b][0] for a in add])
        assert numbers == expected, b  # every member there, those added by members too
        done = [r for r in members if r.status == "done"]
        cancelled = [r for r in members if r.status == "failed" and r.error_class == CANCELLED_CLASS]
        failed = [r for r in members if r.status == "failed" and r.error_class != CANCELLED_CLASS]
        with runtime.sessions() as session:
            progress = batch.progress(session)
        # The counters, raised by whichever transaction wrote each outcome, match the rows exactly.
        assert (progress.done, progress.failed, progress.cancelled, progress.pending) == (
            len(done), len(failed), len(cancelled), 0), b
        for r in members:  # a loud member's effect once if it ran to done, never if not; a quiet one's result
            payload = json.loads(r.payload)
            if not payload["quiet"]:
                assert effect[("member", payload["n"])] == (1 if r.status == "done" else 0), (b, payload)
        failing = any(fail for _n, _q, fail, _a in BATCHES[b][0])
        allow = BATCHES[b][1]
        assert progress.state == ("cancelled" if failing and not allow else "finished"), b
        wanted = {"chaos.then": 0 if failing and not allow else 1, "chaos.catch": 1 if failing else 0,
                  "chaos.finally": 1}
        callbacks = [r for r in jobs if r.flow is not None and json.loads(r.flow).get("batch") == batch.id]
        assert Counter(r.handler for r in callbacks) == Counter({k: v for k, v in wanted.items() if v}), b
        finishes = {r.finished_at for r in members}
        for callback in callbacks:
            assert callback.status == "done"
            if members:  # dispatched BY a member's outcome transaction: its `now` is that member's finish time
                assert callback.created_at in finishes, (b, callback.handler)
        for role, handler in (("then", "chaos.then"), ("finally", "chaos.finally"), ("catch", "chaos.catch")):
            assert effect[(role, b)] == wanted[handler], (b, role)

    for c, chain in zip(CHAINS, chains):
        with runtime.sessions() as session:
            progress = chain.progress(session)
        statuses = [step.status for step in progress.steps]
        if c == FAILING_CHAIN:
            assert (progress.state, statuses) == ("failed", ["done", "failed", "stopped"])
            assert progress.catch is not None and progress.catch.status == "done"
            assert [effect[(f"step{i}", c)] for i in (1, 2, 3)] == [1, 0, 0]
        else:
            assert (progress.state, statuses) == ("finished", ["done", "done", "done"])
            assert [effect[(f"step{i}", c)] for i in (1, 2, 3)] == [1, 1, 1]
        steps = [by_id[step.job_id] for step in progress.steps if step.job_id is not None]
        for before, after in zip(steps, steps[1:]):
            assert after.created_at == before.finished_at  # dispatched by the step before's outcome transaction
    assert effect[("chain-catch", 1)] == 1 and sum(v for (k, _), v in effect.items() if k == "chain-catch") == 1
