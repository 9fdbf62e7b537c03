"""CRONBOX_ACK_FLUSH on every backend: the acks of handlers that do not use ctx.session are batched,
one UPDATE for a batch of fast items, and written once handlers ran the window since the first of
them started, so a killed run repeats at most that much (tests/processes/test_ack_flush_processes.py
kills real runs). Counted here: the ack statements (each family's `ACK`) and the ids each carried."""
from __future__ import annotations

import dataclasses
import math
import time

import pytest
from sqlalchemy import event, func, select, text

import cronbox
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.settings import ACK_FLUSH_DEFAULT, load_settings
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events import deliveries
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from cronbox.outbox.queue.worker import Worker
from tests.helpers import relay

SLEEP = 0.04  # a slow handler's time, at least
WINDOW = 0.1  # CRONBOX_ACK_FLUSH in the slow tests: at most ceil(0.1 / 0.04) = 3 slow items wait for one ack
PER_ACK = math.ceil(WINDOW / SLEEP)


@pytest.fixture
def rt(runtime):
    """Leases of the default margin (the tests' env uses 0): long enough to hold a whole batch, so only
    the window acks before a batch's end (a lease running out acks early, whatever the window)."""
    runtime.settings = dataclasses.replace(runtime.settings, lease_margin=30.0)
    return runtime


class Acks:
    """The ids each ack statement of a family carried, in order (the engine's `before_execute` event:
    the family's ACK statement object itself, so nothing else is counted); `log` gets ("ack", ids)."""

    def __init__(self, engine, statement, log: list | None = None):
        self.engine, self.statement = engine, statement
        self.sizes: list[int] = []
        self.log = log
        event.listen(engine, "before_execute", self._seen)

    def _seen(self, connection, clauseelement, multiparams, params, execution_options):
        if clauseelement is self.statement:
            for values in multiparams or [params]:
                self.sizes.append(len(values["ids"]))
                if self.log is not None:
                    self.log.append(("ack", tuple(values["ids"])))

    def close(self) -> None:
        event.remove(self.engine, "before_execute", self._seen)


@pytest.fixture
def calls() -> list:
    return []


@pytest.fixture
def job_acks(rt, calls):
    acks = Acks(rt.engine, jobstore.ACK, calls)
    yield acks
    acks.close()


@pytest.fixture
def delivery_acks(rt):
    acks = Acks(rt.engine, deliveries.ACK)
    yield acks
    acks.close()


def relay_events(runtime, event_type: str, count: int) -> int:
    """Record `count` events, then run the relay; how many deliveries it finished."""
    with runtime.sessions.begin() as session:
        for n in range(count):
            cronbox.record(session, event_type, {"n": n})
    return relay(runtime).done


def work(runtime, queue: str) -> Worker:
    worker = Worker(runtime, [queue])
    worker.run(Budget(max_time=60, memory_mb=None))
    return worker


def dispatch(runtime, handler, count: int) -> None:
    with runtime.sessions.begin() as session:
        for n in range(count):
            handler.dispatch(session, {"n": n})


def windowed(runtime, seconds: float = WINDOW, **more) -> None:
    runtime.settings = dataclasses.replace(runtime.settings, ack_flush=seconds, **more)


def test_a_batch_of_fast_quiet_jobs_is_acked_with_one_update(rt, registry, job_acks):
    @job("noop", name="noop", registry=registry)
    def noop(payload, ctx):
        pass

    dispatch(rt, noop, 100)
    assert rt.settings.ack_flush == ACK_FLUSH_DEFAULT
    assert work(rt, "noop").stats.done == 100
    assert job_acks.sizes == [100]  # the worker's batch: one claim, one ack


def test_a_batch_of_fast_quiet_deliveries_is_acked_with_one_update(rt, registry, delivery_acks):
    @consumer("noop", name="noop", registry=registry)
    def noop(event, ctx):
        pass

    assert relay_events(rt, "noop", 100) == 100
    assert delivery_acks.sizes == [100]  # the relay's batch


def test_slow_quiet_jobs_are_acked_once_the_window_of_handler_time_passed(rt, registry, job_acks):
    windowed(rt)

    @job("slow", name="slow", registry=registry)
    def slow(payload, ctx):
        time.sleep(SLEEP)

    dispatch(rt, slow, 12)
    assert work(rt, "slow").stats.done == 12
    assert sum(job_acks.sizes) == 12
    assert max(job_acks.sizes) <= PER_ACK, job_acks.sizes  # never the whole batch of 12 at its end


def test_slow_quiet_deliveries_are_acked_once_the_window_of_handler_time_passed(rt, registry, delivery_acks):
    windowed(rt)

    @consumer("slow", name="slow", registry=registry)
    def slow(event, ctx):
        time.sleep(SLEEP)

    assert relay_events(rt, "slow", 12) == 12
    assert sum(delivery_acks.sizes) == 12 and max(delivery_acks.sizes) <= PER_ACK, delivery_acks.sizes


def test_the_time_of_handlers_acked_on_their_own_counts_toward_the_window(rt, registry, job_acks, calls):
    """A quiet job, then jobs writing through ctx.session (each acked with its writes): the quiet job's
    ack waits while their handlers run, until the window, not until the batch's end."""
    windowed(rt)

    @job("mixed", name="mixed", registry=registry)
    def mixed(payload, ctx):
        calls.append(("call", payload["n"]))
        if payload["n"]:
            time.sleep(SLEEP)
            ctx.session.execute(text("SELECT 1"))

    dispatch(rt, mixed, 8)
    with rt.sessions() as session:
        quiet_id = session.scalar(select(func.min(Job.id)))  # job 0's
    assert work(rt, "mixed").stats.done == 8
    # Jobs 1-3 ran at least 3 x 40 ms >= 100 ms after job 0: its ack comes before job 4 starts (sooner
    # when the sleeps ran long), not at the batch's end; each of the others is acked with its writes.
    assert calls.index(("ack", (quiet_id,))) < calls.index(("call", 4)), calls
    assert job_acks.sizes == [1] * 8


def test_a_group_of_quiet_jobs_stays_open_no_longer_than_the_window(rt, registry, job_acks):
    """A group acks its members at its end: CRONBOX_ACK_FLUSH caps CRONBOX_GROUP_MS."""
    windowed(rt, group_ms=20_000)

    @job("grouped", name="grouped", grouped=True, registry=registry)
    def grouped(payload, ctx):
        time.sleep(SLEEP)

    dispatch(rt, grouped, 12)
    assert work(rt, "grouped").stats.done == 12
    assert sum(job_acks.sizes) == 12
    assert max(job_acks.sizes) <= PER_ACK, job_acks.sizes


@pytest.mark.backends("sqlite")  # settings only
@pytest.mark.parametrize("value, seconds", [("500ms", 0.5), ("2s", 2.0), (" 1MS ", 0.001), ("1h", 3600.0)])
def test_the_window_is_a_duration_with_its_unit(env, value, seconds):
    assert load_settings(environ={**env, "CRONBOX_ACK_FLUSH": value}).ack_flush == seconds


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("value, says", [
    ("500", "CRONBOX_ACK_FLUSH=500: a duration needs a unit (s, m, h, d), e.g. 500ms"),
    ("0.5", "CRONBOX_ACK_FLUSH=0.5: a duration needs a unit (s, m, h, d), e.g. 0.5ms"),
    ("0ms", "CRONBOX_ACK_FLUSH=0ms: a duration must be more than zero"),
    ("0.5ms", "CRONBOX_ACK_FLUSH=0.5ms must be between 1ms and 1h"),
    ("2h", "CRONBOX_ACK_FLUSH=2h must be between 1ms and 1h"),
    ("fast", "CRONBOX_ACK_FLUSH=fast: this is not a duration (use e.g. 90s, 5m, 48h, 7d, 2w)"),
])
def test_a_window_without_a_unit_or_out_of_bounds_is_refused_in_one_line(env, value, says):
    with pytest.raises(SettingsError) as refused:
        load_settings(environ={**env, "CRONBOX_ACK_FLUSH": value})
    assert str(refused.value) == says
