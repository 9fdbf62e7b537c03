"""Where a consumer runs, with the README's set-up: one handlers module holding a forward target and
the consumer it feeds, one database, a tick and `amqp consume` (real subprocesses, the real broker).
Each event makes one row where the consumer says it runs; unsaid, both commands refuse to start."""
from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import select

import cronbox
from cronbox.outbox.events.models import Delivery
from tests.conftest import run_cli
from tests.handlers.consuming import consumed, metadata as consumed_metadata
from tests.processes.test_consume_processes import declare_and_bind

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")


@pytest.fixture
def placed(env, runtime, rabbit):
    consumed_metadata.create_all(runtime.engine)
    exchange = rabbit.exchange()
    queue = rabbit.name("placed")
    rabbit.queues.append(queue)
    env = {**env, "CRONBOX_HANDLERS": "tests.handlers.placed", "CRONBOX_AMQP_URL": rabbit.url,
           "TEST_AMQP_EXCHANGE": exchange}
    return env, exchange, queue


def record(runtime, count: int) -> None:
    with runtime.sessions.begin() as session:
        for n in range(count):
            cronbox.record(session, "placed.paid", {"n": n}, key=f"a:{n}")


def rows(runtime) -> Counter:
    with runtime.sessions() as session:
        return Counter(n for (n,) in session.execute(select(consumed.c.n).where(consumed.c.consumer == "placed.consumer")))


@pytest.mark.parametrize("runs, per_event", [("tick", 1), ("broker", 1), ("both", 2)])
def test_the_readme_set_up_makes_one_row_per_event_where_the_consumer_runs(placed, runtime, rabbit, runs, per_event):
    env, exchange, queue = placed
    env = {**env, "TEST_RUNS": runs}
    declare_and_bind(env, queue, f"{exchange}:placed.#")
    record(runtime, 3)
    tick = run_cli(env, "tick", "--no-linger")
    assert tick.returncode == 0, tick.stderr[-2000:]
    in_tick = rows(runtime)
    assert in_tick == (Counter({0: 1, 1: 1, 2: 1}) if runs in ("tick", "both") else Counter())
    consume = run_cli(env, "amqp", "consume", "--queue", queue, "--max-messages", "3", "--max-time", "20")
    assert consume.returncode == 0, consume.stderr[-2000:]
    assert rows(runtime) == Counter({0: per_event, 1: per_event, 2: per_event})
    if runs == "tick":  # nothing here runs it off the broker: the forwarded copies are parked, not run
        assert "(3 bad)" in consume.stdout
    with runtime.sessions() as session:  # the tick made no delivery row for a consumer it does not run
        consumers = set(session.scalars(select(Delivery.consumer)))
    assert consumers == ({"placed.forward", "placed.consumer"} if runs != "broker" else {"placed.forward"})


def test_an_unsaid_place_next_to_a_matching_forward_is_refused_by_both_commands(placed, runtime):
    env, _exchange, queue = placed
    record(runtime, 1)
    for args in (["tick", "--no-linger"], ["amqp", "consume", "--queue", queue, "--max-time", "60"]):
        proc = run_cli(env, *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, (args, proc.stderr[-2000:])
        assert "'placed.consumer'" in lines[0] and 'runs="tick"' in lines[0] and 'runs="broker"' in lines[0]
    assert rows(runtime) == Counter()
