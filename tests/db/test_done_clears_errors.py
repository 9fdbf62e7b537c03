"""A job or delivery that succeeds after failing shows no error: its earlier attempt's `last_error`
(and a job's `error_class`, `traceback`) go with the ack, whether it was retried by backoff, by
`queue retry` / `outbox retry` (command line or console), or acked with a group. On every backend."""
from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import select

from cronbox import outbox
import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from cronbox.outbox.queue.worker import Worker
from tests.helpers import deliveries, invoke, relay

T0 = datetime(2026, 12, 2, 12, 0, 0)


def work(runtime):
    Worker(runtime, None).run(Budget(max_time=30, memory_mb=None))


def jobs(runtime) -> list[Job]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def errors_of(row) -> tuple:
    return tuple(getattr(row, name, None) for name in ("last_error", "error_class", "traceback"))


def failing_then_working(failures: int):
    """A handler body that raises `failures` times per item, then succeeds."""
    seen: dict = {}

    def body(item_key, *, permanent: bool = False):
        seen[item_key] = seen.get(item_key, 0) + 1
        if seen[item_key] <= failures:
            raise (cronbox.PermanentFailure if permanent else RuntimeError)(f"gateway down for {item_key}")

    return body


@pytest.mark.parametrize("grouped", [False, True])
def test_a_job_retried_by_backoff_then_done_shows_no_error(runtime, registry, grouped):
    fail = failing_then_working(1)

    @job("mail", name="flaky", backoff=[60], grouped=grouped, registry=registry)
    def flaky(payload, ctx):
        fail(payload["n"])

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            for n in range(3):
                flaky.dispatch(session, {"n": n})
        work(runtime)
        assert all(r.status == "ready" and "gateway down" in r.last_error for r in jobs(runtime))
        clock.advance(120)
        work(runtime)
    assert [(r.status, errors_of(r)) for r in jobs(runtime)] == [("done", (None, None, None))] * 3


@pytest.mark.parametrize("grouped", [False, True])
def test_a_failed_job_retried_by_the_operator_then_done_shows_no_error(runtime, registry, env, grouped):
    fail = failing_then_working(1)

    @job("mail", name="flaky", tries=1, grouped=grouped, registry=registry)
    def flaky(payload, ctx):
        fail(payload["n"], permanent=True)

    with runtime.sessions.begin() as session:
        ids = [flaky.dispatch(session, {"n": n}) for n in range(2)]
    work(runtime)
    assert [(r.status, r.error_class) for r in jobs(runtime)] == [("failed", "PermanentFailure")] * 2
    assert all(r.traceback for r in jobs(runtime))
    assert invoke(env, "queue", "retry", str(ids[0])).exit_code == 0
    assert invoke(env, "queue", "retry", "--all").exit_code == 0
    work(runtime)
    assert [(r.status, errors_of(r)) for r in jobs(runtime)] == [("done", (None, None, None))] * 2


@pytest.mark.parametrize("grouped", [False, True])
def test_a_delivery_retried_by_backoff_then_done_shows_no_error(runtime, registry, grouped):
    fail = failing_then_working(1)

    @consumer("order.paid", name="mailer", backoff=[60], grouped=grouped, registry=registry)
    def mailer(event, ctx):
        fail(event.payload["n"])

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            for n in range(3):
                cronbox.record(session, "order.paid", {"n": n}, key=None if n else "order-7")
        relay(runtime)
        assert all(d.status == "pending" and "gateway down" in d.last_error for d in deliveries(runtime))
        clock.advance(120)
        relay(runtime)
    assert [(d.status, d.last_error) for d in deliveries(runtime)] == [("done", None)] * 3


@pytest.mark.parametrize("grouped", [False, True])
def test_a_dead_delivery_retried_by_the_operator_then_done_shows_no_error(runtime, registry, env, grouped):
    fail = failing_then_working(1)

    @consumer("order.paid", name="mailer", max_attempts=1, grouped=grouped, registry=registry)
    def mailer(event, ctx):
        fail(event.payload["n"])

    with runtime.sessions.begin() as session:
        for n in range(2):
            cronbox.record(session, "order.paid", {"n": n}, key="order-7")
    relay(runtime)
    dead = deliveries(runtime)
    assert [d.status for d in dead] == ["dead", "pending"]  # the second waits behind its key's dead one
    assert invoke(env, "outbox", "retry", str(dead[0].id)).exit_code == 0
    relay(runtime)
    first, second = deliveries(runtime)
    assert (first.status, first.last_error) == ("done", None)
    assert second.status == "dead" and "gateway down" in second.last_error  # its own first try
    assert invoke(env, "outbox", "retry", "--all").exit_code == 0
    relay(runtime)
    assert [(d.status, d.last_error) for d in deliveries(runtime)] == [("done", None)] * 2
