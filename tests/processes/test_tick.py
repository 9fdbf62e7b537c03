"""The tick as cron runs it: real processes, crashes at every boundary, races, budgets."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from cronbox.cron.cli import main
from cronbox.cron.scheduling.models import ScheduleRun
from cronbox.cron.scheduling.tick import run_tick
from cronbox import outbox
import cronbox
from cronbox.outbox.core.faults import CRASH_EXIT_CODE
from cronbox.outbox.engine.models import Heartbeat
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.events.models import Delivery
from tests.conftest import APP_ROOT, child_env, run_cli
from tests.handlers.effects import effects, metadata as effects_metadata
from tests.helpers import cronbox_log, deliveries, reaped, run_until, table_column, wait_for

HANDLERS = "tests.handlers.effects"
LEASE = 0.55  # the test consumers' timeout (0.5 s) + CRONBOX_LEASE_MARGIN=0, and a little


def record(runtime, event_type: str, count: int, **kwargs) -> list[int]:
    with runtime.sessions.begin() as session:
        events = [cronbox.record(session, event_type, {"n": n}, **kwargs) for n in range(count)]
        session.flush()
        return [e.id for e in events]


def heartbeats(runtime) -> list[Heartbeat]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Heartbeat).order_by(Heartbeat.id)))


def db_effects(runtime) -> Counter:
    with runtime.sessions() as session:
        return Counter(dict(session.execute(
            select(effects.c.event_id, func.count()).group_by(effects.c.event_id)).all()))


def unfinished(runtime) -> int:
    with runtime.sessions() as session:
        return session.scalar(select(func.count()).select_from(Delivery).where(Delivery.status != "done"))


def clean_tick(tick_env) -> None:
    proc = run_cli(tick_env, "tick", "--no-linger")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def tick_env(env, runtime, tmp_path):
    effects_metadata.create_all(runtime.engine)
    return {**env, "CRONBOX_HANDLERS": HANDLERS, "TEST_EFFECTS_FILE": str(tmp_path / "effects.txt")}


@pytest.mark.slow
@pytest.mark.parametrize("step", ["after-claim", "in-handler", "before-ack-commit", "after-ack-commit"])
def test_crash_at_every_boundary_loses_nothing_and_applies_once(runtime, tick_env, tmp_path, step):
    ids = record(runtime, "work", 8)
    rng = random.Random(f"{step}-{runtime.settings.database_url[:5]}")
    crashes = 0
    for nth in [rng.randint(1, 4) for _ in range(4)]:
        proc = run_cli(tick_env, "tick", "--no-linger", "--max-time", "30", CRONBOX_CRASH_AT=f"{step}:{nth}")
        assert proc.returncode in (0, CRASH_EXIT_CODE), proc.stdout + proc.stderr
        crashes += proc.returncode == CRASH_EXIT_CODE
        time.sleep(LEASE)  # the leases of what a crashed run held expire
    run_until(lambda: clean_tick(tick_env), lambda: unfinished(runtime) == 0, pause=LEASE)
    assert crashes >= 2, "the fault was hardly injected"
    assert unfinished(runtime) == 0
    assert db_effects(runtime) == Counter({i: 1 for i in ids})  # database effects exactly once
    seen = Counter(int(line) for line in (tmp_path / "effects.txt").read_text().split())
    assert set(seen) == set(ids)  # external effects at least once


@pytest.mark.slow
def test_random_sigkills_lose_nothing(runtime, tick_env, tmp_path):
    ids = record(runtime, "work", 60)
    rng = random.Random(42)
    env = child_env({**tick_env, "TEST_SLEEP": "0.01"})
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-m", "cronbox", "tick", "--max-time", "20"], env=env, cwd="/",
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.6, 1.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(LEASE)
    run_until(lambda: clean_tick(tick_env), lambda: unfinished(runtime) == 0, pause=LEASE)
    assert unfinished(runtime) == 0
    assert db_effects(runtime) == Counter({i: 1 for i in ids})
    seen = Counter(int(line) for line in (tmp_path / "effects.txt").read_text().split())
    assert set(seen) == set(ids)


@pytest.mark.slow
def test_a_consumer_that_kills_the_process_every_time_ends_dead(runtime, tick_env):
    record(runtime, "poison", 1)
    codes = []
    for _ in range(6):
        proc = run_cli(tick_env, "tick", "--no-linger")
        codes.append(proc.returncode)
        if proc.returncode == 0:
            break
        time.sleep(LEASE)
    assert codes == [9, 9, 9, 0]  # three attempts die with the process; the fourth claim gives up
    [row] = deliveries(runtime)
    # The attempts that ran (max_attempts=3), everywhere: the row, its error, the log line, `outbox dead`
    # (issue 35: the fourth claim's attempt, which never runs, was kept).
    assert row.status == "dead" and row.attempts == 3
    assert row.last_error.startswith("gave up: attempt 3 of 3 was claimed but never finished")
    assert "outcome=dead attempt=3/3" in cronbox_log(runtime)
    listed = run_cli(tick_env, "outbox", "dead")
    assert table_column(listed.stdout, "attempts") == ["3"] and "attempt 3 of 3" in listed.stdout, listed.stdout


def test_four_ticks_released_together_exactly_one_works(runtime, tick_env, tmp_path):
    record(runtime, "block", 1)
    ready, go = tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    inside, release = tmp_path / "inside", tmp_path / "release"
    env = child_env({**tick_env, "TEST_INSIDE_FILE": str(inside), "TEST_RELEASE_FILE": str(release)})
    procs = [subprocess.Popen([sys.executable, "-m", "tests.barrier_tick", str(ready), str(go), "tick", "--no-linger"],
                              env=env, cwd=str(APP_ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    try:
        wait_for(lambda: len(list(ready.iterdir())) == 4, "all four ticks at the barrier")
        go.write_text("go")
        # The winner sits in the blocking consumer, holding the lock, until the others are done.
        wait_for(lambda: sum(p.poll() is not None for p in procs) == 3, "three ticks to give up")
        release.write_text("go")
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in procs]
    assert codes == [0, 0, 0, 0], outputs
    skipped = [out for out, err in outputs if out.strip() == "skipped: tick already running"]
    worked = [out for out, err in outputs if out.startswith("tick: delivered 1")]
    assert len(skipped) == 3 and len(worked) == 1, outputs
    assert [h.command for h in heartbeats(runtime)] == ["tick"]
    assert inside.read_text() in {str(p.pid) for p in procs}


def test_lingering_tick_delivers_events_recorded_while_it_runs(runtime, registry):
    """An event recorded once the tick's pass is over (it delivered the one event that was due) is
    delivered by a later poll of the same run. It is due half a second after it is recorded: the pass
    that found the first one finds nothing more, so only the linger can deliver it (a tick that did not
    linger would end "empty" without it). The writer waits for the tick's steps, not for a time;
    --max-time leaves a loaded machine room for them all."""
    seen: list[tuple[str, int]] = []
    consumer("first", name="first", registry=registry)(lambda event, ctx: seen.append(("first", event.payload["n"])))
    consumer("late", name="late", registry=registry)(lambda event, ctx: seen.append(("late", event.payload["n"])))
    record(runtime, "first", 1)
    problems: list[BaseException] = []

    def write_once_lingering():
        try:
            wait_for(lambda: [d.status for d in deliveries(runtime, consumer="first")] == ["done"],
                     "the tick's pass to deliver the first event")
            record(runtime, "late", 1, delay=0.5)
        except BaseException as exc:  # the test fails on it below, not silently in the thread
            problems.append(exc)

    writer = threading.Thread(target=write_once_lingering)
    writer.start()
    max_time = 15
    started = time.monotonic()
    # memory_mb=None: in-process, RSS is the whole test session's (other tests' imports and buffers), not the tick's.
    report = run_tick(runtime, run_command=main, max_time=max_time, linger=True, memory_mb=None)
    writer.join()
    assert not problems, problems
    assert seen == [("first", 0), ("late", 0)]
    assert report.result.stop_reason == "max-time" and report.exit_code == 0
    # Lingered to the end of --max-time, less the time headroom it keeps free once it handled something
    # (a tenth of --max-time: outbox.engine.budget).
    assert time.monotonic() - started >= max_time * 0.9 - 0.5
    [beat] = heartbeats(runtime)
    assert beat.outcome == "max-time" and beat.delivered == 2 and beat.finished_at is not None


def test_memory_limit_stops_claiming(runtime, registry):
    consumer("m", name="m", registry=registry)(lambda event, ctx: None)
    record(runtime, "m", 3)
    report = run_tick(runtime, run_command=main, max_time=10, linger=True, memory_mb=8)  # any Python process is above 8 MB
    assert report.result.stop_reason == "memory"
    assert report.relay.stats.done == 0
    assert all(d.claim_token is None for d in deliveries(runtime))


def test_max_time_stops_claiming_and_releases_unstarted_leases(runtime, registry):
    consumer("s", name="s", registry=registry)(lambda event, ctx: time.sleep(0.5))
    record(runtime, "s", 80)
    started = time.monotonic()
    # max_time 8: the built-in tasks and the claim leave items to run however loaded the machine
    report = run_tick(runtime, run_command=main, max_time=8, linger=True, memory_mb=None)  # see the lingering test
    took = time.monotonic() - started
    assert report.result.stop_reason == "max-time"
    assert 1 <= report.relay.stats.done < 80
    # --max-time 8 plus the item in hand (0.5 s) and a loaded machine's slack; running on to the
    # last of the 80 would take 40 s at least.
    assert took < 25
    rows = deliveries(runtime)
    assert all(d.claim_token is None for d in rows)  # nothing left leased
    assert all(d.attempts == (1 if d.status == "done" else 0) for d in rows)  # released claims cost no attempt


def test_sigterm_finishes_the_current_handler_and_exits_zero(runtime, tick_env, tmp_path):
    record(runtime, "block", 1)
    inside, release = tmp_path / "inside", tmp_path / "release"
    proc = subprocess.Popen([sys.executable, "-m", "cronbox", "tick", "--max-time", "30"],
                            env=child_env({**tick_env, "TEST_INSIDE_FILE": str(inside),
                                           "TEST_RELEASE_FILE": str(release)}),
                            cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(inside.exists, "the handler to start")
    proc.send_signal(signal.SIGTERM)
    # Once the tick took the signal (its log says so), not a fixed 0.3 s after it was sent, which a
    # loaded machine could pass before the signal was handled: then nothing would be checked.
    wait_for(lambda: "received SIGTERM" in cronbox_log(runtime), "the tick to take the SIGTERM")
    assert proc.poll() is None  # still finishing the handler
    release.write_text("go")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "delivered 1" in out and "stopped: signal" in out
    [row] = deliveries(runtime)
    assert row.status == "done"


def test_sigterm_to_an_idle_lingering_tick_stops_it_at_once(runtime, tick_env, tmp_path):
    """Between polls a lingering tick waits: a sleep, or on PostgreSQL its LISTEN connection's socket.
    A stop signal there ends the run within a wait step, not at --max-time."""
    record(runtime, "work", 1)
    proc = subprocess.Popen([sys.executable, "-m", "cronbox", "tick", "--max-time", "600"], env=child_env(tick_env),
                            cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def pass_over() -> bool:  # the event's deliveries acked and the built-in tasks finished: it lingers
        tasks = [status for _, _, status, _ in slot_rows(runtime)]
        rows = deliveries(runtime)
        return bool(rows and tasks) and all(d.status == "done" for d in rows) and "running" not in tasks

    with reaped(proc):
        wait_for(pass_over, "the tick's pass to be over")
        time.sleep(0.5)  # (past its last statements: in its wait between polls)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    # A 0.1 s wait step, then the process's own exit: on a loaded machine that can take seconds, so the
    # bound is generous; what it tells apart is a stop at --max-time, minutes later.
    assert time.monotonic() - started < 120, out
    assert proc.returncode == 0, err
    assert "stopped: signal" in out, out


@pytest.mark.slow
def test_a_killer_consumer_in_a_batch_does_not_use_up_its_batch_mates(runtime, tick_env):
    ids = record(runtime, "work", 2) + record(runtime, "poison", 1) + record(runtime, "work", 2)
    codes = []
    for _ in range(8):
        proc = run_cli(tick_env, "tick", "--no-linger")
        codes.append(proc.returncode)
        if proc.returncode == 0:
            break
        time.sleep(LEASE)
    assert codes[-1] == 0 and codes.count(9) == 3
    rows = deliveries(runtime)
    assert [r.status for r in rows if r.consumer == "effects.poison"] == ["dead"]
    others = [r for r in rows if r.consumer != "effects.poison"]
    assert len(others) == 8 and all(r.status == "done" for r in others)
    assert max(r.attempts for r in others) <= 2
    assert db_effects(runtime) == Counter({i: 1 for i in ids if i != ids[2]})


def slot_rows(runtime) -> list[tuple]:
    with runtime.sessions() as session:
        return [(r.task, r.slot, r.status, r.pid) for r in session.scalars(select(ScheduleRun).order_by(ScheduleRun.id))]


def test_a_quiet_tick_runs_no_task_again_in_a_slot_taken(runtime, env):
    """A tick whose built-in tasks already ran in their current slots runs none of them again, and
    leaves the slots' rows as they were; it claims and delivers nothing."""
    assert run_cli(env, "migrate").returncode == 0
    assert run_cli(env, "tick", "--no-linger").returncode == 0  # the built-in tasks' first runs
    first = slot_rows(runtime)
    assert first and all(status == "ok" for _, _, status, _ in first)
    proc = run_cli(env, "tick", "--no-linger")
    assert proc.returncode == 0, proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert "delivered 0" in summary and "jobs done 0" in summary, proc.stdout
    ran = int(summary.split("tasks ")[1].split(",")[0])  # a five-minute boundary since: the health check runs
    second = slot_rows(runtime)
    assert second[:len(first)] == first  # no slot taken twice, no row of the first tick's rewritten
    assert len(second) - len(first) == ran and all(status == "ok" for _, _, status, _ in second)

