"""Concurrency groups and cost budgets on every backend: slots shared by concurrent workers, leases,
waiting without attempts, budgets per window with frozen time (outbox.queue.groups)."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.queue import groups
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import ConcurrencyGroupSlot, Job
from cronbox.outbox.queue.worker import Worker

T0 = datetime(2026, 11, 30, 12, 0, 0)


@pytest.fixture
def env(env):
    return {**env, "CRONBOX_QUEUE_BUDGETS": "metered=5/m", "CRONBOX_GROUP_BUDGETS": "providers=3/m",
            "CRONBOX_GROUP_WAIT": "0.05"}


def work(rt, queues=None, *, batch_size=100):
    worker = Worker(rt, queues, batch_size=batch_size)
    worker.run(Budget(max_time=60, memory_mb=None))
    return worker.stats


def all_jobs(rt) -> list[Job]:
    with rt.sessions() as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def slots(rt) -> list[ConcurrencyGroupSlot]:
    with rt.sessions() as session:
        return list(session.scalars(select(ConcurrencyGroupSlot).order_by(ConcurrencyGroupSlot.group_name,
                                                                          ConcurrencyGroupSlot.slot)))


@pytest.mark.parametrize("batch", [1, 2])  # 2: a worker's second job takes over its first one's slot
def test_four_concurrent_workers_never_run_more_than_the_groups_limit(runtime, registry, monkeypatch, batch):
    """4 workers (threads, each its own runtime and connection) on 8 jobs of a group of limit 2. The
    handlers meet in pairs at a barrier (so two do run at once), then hold their slots until another
    worker was refused one (or a third handler started: the violation the record then shows)."""
    changed = threading.Condition()
    record: list[tuple[str, int]] = []  # ("start" | "end", job number), in the order they happened
    refusals = [0]
    pair = threading.Barrier(2)
    take = groups.take

    def counted_take(*args, **kwargs):
        wait = take(*args, **kwargs)
        if wait is not None:
            with changed:
                refusals[0] += 1
                changed.notify_all()
        return wait

    monkeypatch.setattr(groups, "take", counted_take)

    def running() -> int:
        return sum(1 if kind == "start" else -1 for kind, _ in record)

    @job("g", name="grouped.pair", concurrency_group="pair", concurrency_limit=2, registry=registry)
    def paired(payload, ctx):
        with changed:
            record.append(("start", payload))
            seen = refusals[0]
            changed.notify_all()
        try:
            # The other slot's holder, however late a loaded machine brings it; only a last job alone
            # waits this out. (10 s here and 15 below: within the 30 s lease.)
            pair.wait(timeout=10)
        except threading.BrokenBarrierError:
            with changed:
                pair.reset()
        with changed:  # nobody left to refuse once all 8 started
            changed.wait_for(lambda: refusals[0] > seen or running() > 2
                             or sum(kind == "start" for kind, _ in record) == 8, timeout=15)
            record.append(("end", payload))
            changed.notify_all()

    with runtime.sessions.begin() as session:
        for n in range(8):
            paired.dispatch(session, n)
    start = threading.Barrier(4)
    errors = []

    def worker_thread():
        rt = Runtime(runtime.settings, registry=registry)
        try:
            start.wait(timeout=30)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with changed:
                    if sum(1 for kind, _ in record if kind == "end") == 8:
                        return
                work(rt, ["g"], batch_size=batch)
        except Exception as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            rt.dispose()

    threads = [threading.Thread(target=worker_thread) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    running = peak = 0
    for kind, _ in record:
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak == 2, record
    assert sorted(n for kind, n in record if kind == "end") == list(range(8))
    rows = all_jobs(runtime)
    assert all(j.status == "done" and j.attempts == 1 for j in rows), [(j.status, j.attempts) for j in rows]
    assert all(s.holder is None for s in slots(runtime))


def grouped_and_free(registry, group: str, limit: int) -> tuple[list, object, object]:
    """Two jobs on queue q recording their payloads in one list: one in `group`, one in none."""
    ran = []
    member = job("q", name="member", concurrency_group=group, concurrency_limit=limit,
                 registry=registry)(lambda payload, ctx: ran.append(payload))
    free = job("q", name="free", registry=registry)(lambda payload, ctx: ran.append(payload))
    return ran, member, free


def test_a_full_group_defers_without_attempts_and_others_go_on(runtime, registry):
    ran, capped, free = grouped_and_free(registry, "one", 1)

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            capped.dispatch(session, "c1")
            free.dispatch(session, "f1")
        # Another worker (another host) holds the only slot until T0 + 60 s.
        assert in_transaction(runtime.sessions, lambda s: groups.take(
            s, "one", 1, "elsewhere", T0 + timedelta(seconds=60), T0)) is None
        stats = work(runtime, ["q"])
        assert ran == ["f1"] and stats.deferred == 1
        waiting = [j for j in all_jobs(runtime) if j.handler == "member"][0]
        assert waiting.status == "ready" and waiting.attempts == 0
        assert waiting.available_at == T0 + timedelta(seconds=0.05)  # CRONBOX_GROUP_WAIT
        clock.advance(61)  # the holder's lease ran out without it ever coming back
        work(runtime, ["q"])
    assert ran == ["f1", "c1"]
    assert [j.attempts for j in all_jobs(runtime)] == [1, 1]


def test_one_worker_runs_a_limit_one_group_back_to_back_freeing_the_slot_with_each_outcome(runtime, registry):
    """The slot is freed in the transaction of each outcome (ack, retry, failure), so the next job of
    the batch takes it at once, never deferred by its own worker."""
    ran = []

    @job("q", name="serial", concurrency_group="serial", concurrency_limit=1, tries=2, backoff=[0],
         registry=registry)
    def serial(payload, ctx):
        ran.append(payload)
        if payload == "boom":
            raise RuntimeError("boom")
        if payload == "write":
            ctx.session.execute(select(1))

    with runtime.sessions.begin() as session:
        for p in ("a", "boom", "write", "b"):
            serial.dispatch(session, p)
    stats = work(runtime, ["q"])
    assert stats.deferred == 0 and stats.done == 3 and stats.retried == 1
    assert all(s.holder is None for s in slots(runtime))
    work(runtime, ["q"])  # boom's second try fails for good: its slot is freed with the give-up too
    assert ran == ["a", "boom", "write", "b", "boom"]
    assert [j.status for j in all_jobs(runtime)] == ["done", "failed", "done", "done"]
    assert all(s.holder is None for s in slots(runtime))


def test_a_slot_whose_lease_ran_out_is_free_and_a_live_one_is_not(runtime):
    take = lambda holder, now, lease: in_transaction(runtime.sessions, lambda s: groups.take(  # noqa: E731
        s, "g2", 2, holder, lease, now))
    assert take("a", T0, T0 + timedelta(seconds=30)) is None
    assert take("b", T0, T0 + timedelta(seconds=10)) is None
    assert take("c", T0, T0 + timedelta(seconds=30)) == pytest.approx(2.0)  # full: the default wait, at most
    assert take("c", T0 + timedelta(seconds=9.5), T0 + timedelta(seconds=40)) == pytest.approx(0.5)  # b's end
    assert take("c", T0 + timedelta(seconds=10), T0 + timedelta(seconds=40)) is None  # b's lease ran out
    assert {s.holder for s in slots(runtime)} == {"a", "c"}
    assert in_transaction(runtime.sessions, lambda s: groups.extend(s, "g2", "c", T0 + timedelta(seconds=90)))
    assert take("d", T0 + timedelta(seconds=50), T0 + timedelta(seconds=99)) is None  # a's lease ran out
    assert take("e", T0 + timedelta(seconds=50), T0 + timedelta(seconds=99)) == pytest.approx(2.0)  # c's was extended
    assert in_transaction(runtime.sessions, lambda s: groups.release(s, [("other", "c")])) == 0  # not its group
    assert in_transaction(runtime.sessions, lambda s: groups.release(s, [("g2", "d")])) == 1
    with runtime.sessions() as session:
        [use] = [u for u in groups.overview(session, runtime.jobs, T0 + timedelta(seconds=11)) if u.name == "g2"]
    assert (use.limit, use.in_use, use.waiting) == (None, 1, 0)  # no job declares g2 here


def test_cost_budget_per_queue_waits_for_the_next_window_without_attempts(runtime, registry):
    ran = []
    metered = job("metered", name="metered", cost=2, registry=registry)(lambda payload, ctx: ran.append(payload))

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            for n in range(5):
                metered.dispatch(session, n)
            metered.dispatch(session, "cheap", cost=1)
        stats = work(runtime, ["metered"])
        # 2 + 2 of 5; a third would make 6, but the cheap one fits what is left (no head-of-line wait)
        assert ran == [0, 1, "cheap"] and stats.deferred == 3
        assert all(j.attempts == 0 for j in all_jobs(runtime) if j.status == "ready")
        with runtime.sessions() as session:
            [queue_budget] = [u for u in groups.budget_overview(session, runtime.settings, clock.utcnow())
                              if u.budget.scope == "queue"]
        assert (queue_budget.used, queue_budget.budget.limit, queue_budget.resets_in) == (5, 5, 60)
        clock.advance(60)
        work(runtime, ["metered"])
        assert ran == [0, 1, "cheap", 2, 3]
        clock.advance(60)
        work(runtime, ["metered"])
    assert ran == [0, 1, "cheap", 2, 3, 4]
    assert all(j.status == "done" and j.attempts == 1 for j in all_jobs(runtime))


def test_group_budget_and_slot_are_taken_together_or_not_at_all(runtime, registry):
    """A group's budget refusing after its slot was taken rolls the slot back (one transaction)."""
    ran, provider, other = grouped_and_free(registry, "providers", 5)

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            provider.dispatch(session, "heavy", cost=4)  # more than providers' 3/m: can never run
            for n in range(4):
                provider.dispatch(session, n)
            other.dispatch(session, "x", concurrency_group="providers", cost=2)
        stats = work(runtime, ["q"])
        assert ran == [0, 1, 2] and stats.deferred == 2 and stats.gave_up == 1
        assert all(s.holder is None for s in slots(runtime))
        failed = [j for j in all_jobs(runtime) if j.status == "failed"]
        assert [j.payload for j in failed] == ['"heavy"']
        assert "cost 4 is more than the group providers budget of 3/m" in failed[0].last_error
        clock.advance(60)
        work(runtime, ["q"])
    assert ran == [0, 1, 2, 3, "x"]


def test_registration_and_dispatch_refuse_bad_groups_and_costs(runtime, registry):
    from cronbox.outbox.core.errors import RegistrationError

    def register(**kwargs):
        return job("q", name=f"j{len(registry.jobs.all())}", registry=registry, **kwargs)(lambda p, c: None)

    with pytest.raises(RegistrationError, match="go together"):
        register(concurrency_group="x")
    with pytest.raises(RegistrationError, match="concurrency_limit must be"):
        register(concurrency_group="x", concurrency_limit=0)
    with pytest.raises(RegistrationError, match="concurrency_group 'a b'"):
        register(concurrency_group="a b", concurrency_limit=1)
    with pytest.raises(RegistrationError, match="grouped=True cannot be combined with concurrency_group"):
        register(concurrency_group="x", concurrency_limit=1, grouped=True)
    with pytest.raises(RegistrationError, match="cost must be"):
        register(cost=0)
    register(concurrency_group="x", concurrency_limit=2)
    with pytest.raises(RegistrationError, match="one group, one limit"):
        register(concurrency_group="x", concurrency_limit=3)
    plain = register()
    with runtime.sessions.begin() as session:
        with pytest.raises(PayloadError, match="not declared"):
            plain.dispatch(session, None, concurrency_group="nobody")
        with pytest.raises(PayloadError, match="cost must be"):
            plain.dispatch(session, None, cost=-1)
        assert isinstance(plain.dispatch(session, None, concurrency_group="x", cost=3), int)
        grouped = register(grouped=True)
        with pytest.raises(PayloadError, match="grouped=True"):
            grouped.dispatch(session, None, concurrency_group="x")
    [row] = all_jobs(runtime)
    assert (row.concurrency_group, row.cost) == ("x", 3)


def test_overview_counts_waiting_jobs_of_a_group_by_handler_and_by_dispatch(runtime, registry):
    @job("q", name="member", concurrency_group="providers", concurrency_limit=3, registry=registry)
    def member(payload, ctx):
        pass

    @job("q", name="outsider", registry=registry)
    def outsider(payload, ctx):
        pass

    with runtime.sessions.begin() as session:
        member.dispatch(session, 1)
        member.dispatch(session, 2, delay=60)
        outsider.dispatch(session, 3, concurrency_group="providers")
        outsider.dispatch(session, 4)
    in_transaction(runtime.sessions, lambda s: groups.take(s, "providers", 3, "h", T0 + timedelta(days=9999), T0))
    with runtime.sessions() as session:
        [use] = groups.overview(session, runtime.jobs, clock.utcnow())
    assert (use.name, use.limit, use.in_use, use.waiting) == ("providers", 3, 1, 3)


def test_the_next_job_of_a_group_in_a_batch_takes_the_slot_over_and_a_refused_one_lets_it_go(runtime, registry):
    """One worker, one batch: each job's slot passes to the next job of the group (never two held
    at once, never a slot left behind), and when the next one is refused (the group's budget of 3 is
    spent) the slot kept for it is freed at once."""
    seen = []
    observer = Runtime(runtime.settings, registry=registry)  # the worker holds the runtime's one connection

    def live_slots():
        with observer.sessions() as session:
            held = select(ConcurrencyGroupSlot).where(ConcurrencyGroupSlot.holder.is_not(None))
            return [s.holder for s in session.scalars(held)]

    @job("q", name="relay", concurrency_group="providers", concurrency_limit=1, registry=registry)
    def relay_job(payload, ctx):
        seen.append((payload, live_slots()))

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            ids = [relay_job.dispatch(session, n) for n in range(5)]
        stats = work(runtime, ["q"])
        assert [n for n, _ in seen] == [0, 1, 2] and stats.done == 3 and stats.deferred == 2
        assert [len(holders) for _, holders in seen] == [1, 1, 1]
        assert [holders[0].split(":")[0] for _, holders in seen] == [str(i) for i in ids[:3]]
        assert live_slots() == []
        assert [(j.status, j.attempts) for j in all_jobs(runtime)] == [("done", 1)] * 3 + [("ready", 0)] * 2
    observer.dispose()
