"""Admission by handler profile on every backend: profiles recorded (window, TTL, one write per run),
items that do not fit given back without an attempt, never-fitting handlers marked and kept waiting,
the kernel's limit (a cgroup folder and an LVE list of the test's own)."""
from __future__ import annotations

import json
import os
from datetime import datetime, timedelta

import pytest
from sqlalchemy import event, select

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.memlimit import cgroup_paths
from cronbox.outbox.core.resources import PROBE
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine import profiles
from cronbox.outbox.engine.admission import NEVER_FITS_DELAY, Admission
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.models import HandlerProfile, Heartbeat
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from cronbox.outbox.queue.worker import Worker
from tests.helpers import invoke

MiB = 2 ** 20


@pytest.fixture
def make_runtime(env, runtime):
    """A runtime on the test's database with extra settings (the registry is the test's)."""
    made = []

    def make(**extra: str) -> Runtime:
        rt = Runtime(load_settings(environ={**env, **extra}), registry=runtime.registry)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.dispose()


def dispatch(rt, handler, count: int = 1) -> list[int]:
    with rt.sessions.begin() as session:
        return [handler.dispatch(session, {"i": i}) for i in range(count)]


def rows(rt) -> dict[str, HandlerProfile]:
    with rt.sessions() as session:
        return {row.handler: row for row in session.scalars(select(HandlerProfile))}


def job_rows(rt) -> list[Job]:
    with rt.sessions() as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def recording_jobs(registry, queue: str, *names: str) -> tuple[list, list]:
    """Jobs `<queue>.<name>` on `queue` that append their name to the list returned, in run order."""
    ran: list[str] = []
    made = [job(queue, name=f"{queue}.{name}", registry=registry)(lambda payload, ctx, name=name: ran.append(name))
            for name in names]
    return ran, made


def put_profile(rt, handler: str, *, ms: int, kb: int, at: datetime | None = None, kind: str = "job") -> None:
    when = (at or clock.utcnow())
    with rt.sessions.begin() as session:
        session.add(HandlerProfile(kind=kind, handler=handler, runs=1, duration_ms=ms, rss_growth_kb=kb,
                                   samples=json.dumps([[profiles.epoch(when), ms, kb]]), updated_at=when))


def test_profiles_are_recorded_within_the_window_in_one_write_per_run(make_runtime, registry):
    rt = make_runtime(CRONBOX_PROFILE_WINDOW="3")

    @job("prof", name="prof.grow", registry=registry)
    def grow(payload, ctx):
        data = bytearray(b"\x01") * (2 * MiB)  # freed after the call: the peak is what counts
        assert data[-1] == 1

    dispatch(rt, grow, 5)
    writes = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if "cronbox_handler_profiles" in statement and not statement.lstrip().upper().startswith("SELECT"):
            writes.append(statement)

    event.listen(rt.engine, "before_cursor_execute", count)
    try:
        Worker(rt, ["prof"]).run(Budget(max_time=30, memory_mb=None))
    finally:
        event.remove(rt.engine, "before_cursor_execute", count)
    row = rows(rt)["prof.grow"]
    assert row.runs == 5 and len(json.loads(row.samples)) == 3  # the window bounds the samples, not the count
    assert row.rss_growth_kb >= 0 and row.duration_ms >= 0 and row.never_fits is None
    assert len(writes) == 1  # one INSERT for the run's five calls: no round trip per job
    assert all(j.status == "done" for j in job_rows(rt))


def test_a_stale_profile_is_ignored_and_measured_again(make_runtime, registry):
    rt = make_runtime(CRONBOX_PROFILE_TTL="1h")
    ran = []

    @job("stale", name="stale.slow", registry=registry)
    def slow(payload, ctx):
        ran.append(payload["i"])

    put_profile(rt, "stale.slow", ms=600_000, kb=0, at=clock.utcnow() - timedelta(hours=2))  # 10 min, 2 h ago
    dispatch(rt, slow)
    Worker(rt, ["stale"]).run(Budget(max_time=30, memory_mb=None, time_headroom=1))
    assert ran == [0]  # the 10-minute profile is past its TTL: unknown, so admitted
    row = rows(rt)["stale.slow"]
    samples = json.loads(row.samples)
    assert len(samples) == 1 and samples[0][1] < 600_000 and row.duration_ms < 600_000  # the stale sample dropped
    with rt.sessions() as session:
        view = {v.handler: v for v in profiles.overview(session, profiles.ProfileSettings.of(rt.settings),
                                                        clock.utcnow())}
    assert not view["stale.slow"].stale and view["stale.slow"].samples == 1


def test_a_job_that_does_not_fit_the_remaining_time_is_given_back_and_the_run_stops(make_runtime, registry):
    rt = make_runtime()
    ran, (slow, quick) = recording_jobs(registry, "fit", "slow", "quick")
    put_profile(rt, "fit.slow", ms=20_000, kb=0)  # 20 s on average
    [slow_id] = dispatch(rt, slow)
    dispatch(rt, quick)
    budget = Budget(max_time=25, memory_mb=None, time_headroom=2)
    budget.started -= 10  # 10 of the 25 s used: 13 s left after the headroom
    worker = Worker(rt, ["fit"])
    worker.run(budget)
    assert ran == [] and worker.stats.deferred == 1 and budget.stop_reason() == "max-time"
    first, second = job_rows(rt)
    assert first.id == slow_id and first.status == "ready" and first.attempts == 0  # given back, no attempt
    assert second.status == "ready" and second.attempts == 0  # claimed behind it: released too
    assert rows(rt)["fit.slow"].never_fits is None  # a fresh run of 25 s fits it

    fresh = Budget(max_time=25, memory_mb=None, time_headroom=2)
    Worker(rt, ["fit"]).run(fresh)
    assert ran == ["slow", "quick"]


def test_a_job_that_never_fits_waits_without_an_attempt_and_runs_where_a_run_has_room(make_runtime, registry):
    rt = make_runtime()
    ran, (long, quick) = recording_jobs(registry, "never", "long", "quick")
    with clock.frozen(clock.utcnow() + timedelta(days=1)):
        put_profile(rt, "never.long", ms=120_000, kb=0)  # 2 minutes: longer than any 55 s tick
        dispatch(rt, long)
        dispatch(rt, quick)
        worker = Worker(rt, ["never"])
        worker.run(Budget(max_time=55, memory_mb=None, time_headroom=2))
        assert ran == ["quick"]  # it does not hold up the queue
        waiting = job_rows(rt)[0]
        assert waiting.status == "ready" and waiting.attempts == 0
        assert waiting.available_at == clock.utcnow() + timedelta(seconds=NEVER_FITS_DELAY)
        row = rows(rt)["never.long"]
        assert "longer than --max-time 55s minus 2s headroom" in row.never_fits and row.never_fits_at is not None
        with rt.sessions() as session:
            assert [r.handler for r in profiles.never_fitting(session)] == ["never.long"]
        clock.advance(NEVER_FITS_DELAY)
        Worker(rt, ["never"]).run(Budget(max_time=None, memory_mb=None))  # no --max-time: room for it
    assert ran == ["quick", "long"] and job_rows(rt)[0].status == "done"


def test_admission_off_runs_everything_and_records_nothing(make_runtime, registry):
    rt = make_runtime(CRONBOX_ADMISSION="off")
    ran = []

    @job("off", name="off.slow", registry=registry)
    def slow(payload, ctx):
        ran.append(1)

    put_profile(rt, "off.slow", ms=120_000, kb=0)
    dispatch(rt, slow)
    Worker(rt, ["off"]).run(Budget(max_time=55, memory_mb=None))
    assert ran == [1] and rows(rt)["off.slow"].runs == 1


def test_memory_that_does_not_fit_the_rest_of_memory_or_ever_is_told_apart(make_runtime):
    rt = make_runtime(CRONBOX_ADMISSION_MEMORY_HEADROOM="8")
    admission = Admission("job", rt.settings)
    admission.book.add("big", 0.1, 60 * 1024)
    admission.book.add("huge", 0.1, 200 * 1024)
    rss = PROBE.rss_kb()
    room = Budget(max_time=None, memory_mb=(rss + 80 * 1024) / 1024)  # 80 MB above the RSS now
    near = Budget(max_time=None, memory_mb=(rss + 40 * 1024) / 1024)
    near.start_rss_kb = rss - 60 * 1024  # it started 60 MB smaller: a fresh run would have room
    assert admission.check("big", room) is None
    verdict = admission.check("big", near)
    assert verdict.later and verdict.stop == "memory" and "grows RSS by 60 MB" in verdict.reason
    assert admission.check("big", Budget(max_time=None, memory_mb=(rss + 40 * 1024) / 1024)).later is False
    verdict = admission.check("huge", room)
    assert not verdict.later and "more than --memory" in verdict.reason and "the run's own" in verdict.reason
    assert set(admission.book.verdicts) == {"big", "huge"} and admission.book.verdicts["huge"] == verdict.reason


def fresh() -> Budget:
    """A run without --memory that started small (the test process itself is not a fresh worker)."""
    budget = Budget(max_time=None, memory_mb=None)
    budget.start_rss_kb = 30 * 1024
    return budget


@pytest.mark.skipif("v2" not in cgroup_paths("/proc/self/cgroup"), reason="no cgroup v2 line in /proc/self/cgroup")
def test_the_cgroup_limit_counts_beside_memory(make_runtime, tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.max").write_text(f"{512 * MiB}\n")
    (root / "memory.current").write_text(f"{480 * MiB}\n")  # 32 MB left under the group's limit
    rt = make_runtime(CRONBOX_CGROUP_ROOT=str(root), CRONBOX_LVE_LIST=str(tmp_path / "none"))
    admission = Admission("job", rt.settings)
    admission.book.add("big", 0.1, 60 * 1024)
    verdict = admission.check("big", fresh())
    assert verdict.later and "left under the cgroup v2" in verdict.reason
    (root / "memory.max").write_text(f"{64 * MiB}\n")
    admission._kernel_due = 0.0  # read the kernel's limit again now
    verdict = admission.check("big", fresh())
    assert not verdict.later and "more than the cgroup v2" in verdict.reason


def test_an_lve_limit_counts_where_the_list_is_readable(make_runtime, tmp_path):
    lve = tmp_path / "list"
    uid = os.getuid()
    lve.write_text("8:LVE EP lCPU lIO CPU MEM IO lMEM lEP nCPU fMEM fEP lMEMPHY lCPUW lNPROC MEMPHY fMEMPHY\n"
                   f"{uid + 1} 0 100 0 0 0 0 0 20 1 0 0 262144 0 100 1000 0 0\n"
                   f"{uid} 0 100 0 0 0 0 0 20 1 0 0 65536 0 100 55000 0 0\n")  # 256 MB limit, ~215 MB used
    rt = make_runtime(CRONBOX_CGROUP_ROOT=str(tmp_path / "no-cgroup"), CRONBOX_LVE_LIST=str(lve))
    admission = Admission("job", rt.settings)
    admission.book.add("big", 0.1, 60 * 1024)
    verdict = admission.check("big", fresh())
    assert verdict.later and f"LVE {uid}" in verdict.reason


@pytest.mark.parametrize("name,value,says", [
    ("CRONBOX_ADMISSION", "maybe", "must be on or off"),
    ("CRONBOX_PROFILE_WINDOW", "0", "must be at least 1"),
    ("CRONBOX_PROFILE_WINDOW", "5000", "at most 1000"),
    ("CRONBOX_PROFILE_TTL", "10s", "between 1 minute and 90 days"),
    ("CRONBOX_PROFILE_TTL", "10", "a duration needs a unit (s, m, h, d), e.g. 10d"),
    ("CRONBOX_ADMISSION_TIME_HEADROOM", "2h", "between 1 second and 1 hour"),
    ("CRONBOX_ADMISSION_MEMORY_HEADROOM", "lots", "is not a number"),
])
def test_bad_settings_are_refused_by_name(env, name, value, says):
    with pytest.raises(SettingsError, match=name) as refused:
        Admission("job", load_settings(environ={**env, name: value}))
    assert says in str(refused.value)


def test_the_cli_shows_profiles_never_fits_and_the_last_pools(env, runtime):
    """At a frozen clock: "0s ago" is what the status says however long a loaded machine takes between
    writing the row and running the commands."""
    with clock.frozen(clock.utcnow()):
        put_profile(runtime, "cli.quick", ms=12, kb=3 * 1024)
        put_profile(runtime, "cli.stale", ms=50, kb=0, at=clock.utcnow() - timedelta(days=30))
        put_profile(runtime, "cli.consumer", ms=7, kb=0, kind="delivery")
        with runtime.sessions.begin() as session:
            row = session.get(HandlerProfile, ("job", "cli.quick"))
            row.never_fits, row.never_fits_at = "runs 120.0s on average, longer than --max-time 55s", clock.utcnow()
            session.add(Heartbeat(command="pool", host="h", pid=1, started_at=clock.utcnow() - timedelta(minutes=3),
                                  finished_at=clock.utcnow() - timedelta(minutes=2), outcome="empty",
                                  detail="workers 3 (peak 3), started 4, restarts 1, jobs 40 done, 0 failed"))
        out = invoke(env, "queue", "profiles").output
        quick = next(line for line in out.splitlines() if "cli.quick" in line)
        assert "12" in quick and "3.0" in quick and "longer than --max-time 55s" in quick
        assert "(stale)" in next(line for line in out.splitlines() if "cli.stale" in line)
        assert "delivery" in next(line for line in out.splitlines() if "cli.consumer" in line)
        status = invoke(env, "queue", "status").output
        assert "never fits: cli.quick (job, 0s ago): runs 120.0s on average" in status
        assert "restarts 1" in status  # the last pool
        assert "never fits" not in invoke(env, "outbox", "status").output  # only deliveries' there
        pools = invoke(env, "queue", "pools").output
        assert "workers 3 (peak 3), started 4, restarts 1" in pools and "empty" in pools and "1m" in pools


def test_a_profile_summary_follows_its_window():
    profile = profiles.Profile()
    for ms, kb in [(100, 5000), (200, 10), (300, 10), (400, 20)]:
        profile.add([0.0, ms, kb], 3)
    assert profile.runs == 4 and [s[1] for s in profile.samples] == [200, 300, 400]
    assert profile.duration == 0.3 and profile.growth_kb == 20  # the 5000 KiB run left the window
    summarized = profiles.Profile(samples=list(profile.samples))
    summarized.summarize()
    assert (summarized.duration, summarized.growth_kb) == (profile.duration, profile.growth_kb)


def test_a_long_run_keeps_only_the_samples_its_write_can_keep(make_runtime):
    """A run's unwritten samples are bounded by the window (a 5,000-job run holds 3 here, not 5,000),
    yet the row gets every run counted, the newest samples, and times to the millisecond as before."""
    rt = make_runtime(CRONBOX_PROFILE_WINDOW="3")
    put_profile(rt, "long.run", ms=900, kb=4096, at=clock.utcnow() - timedelta(minutes=5))  # older: merged out
    admission = Admission("job", rt.settings)
    admission.start(rt.sessions)
    for ms in range(1, 5001):
        admission.book.add("long.run", ms / 1000, ms % 7)
    unwritten = admission.book.pending["long.run"]
    assert unwritten.runs == 5000 and [s[1] for s in unwritten.samples] == [4998, 4999, 5000]
    admission.flush(rt.sessions, force=True)
    row = rows(rt)["long.run"]
    samples = json.loads(row.samples)
    assert row.runs == 5001 and [s[1:] for s in samples] == [[4998, 0], [4999, 1], [5000, 2]]
    assert all(s[0] == round(s[0], 3) and abs(s[0] - profiles.epoch(clock.utcnow())) < 60 for s in samples)
    assert row.duration_ms == 4999 and row.rss_growth_kb == 2 and admission.book.pending == {}


class CountingProbe:
    """The process's RSS as the budget reads it, counted (and set by the test)."""

    def __init__(self, rss_kb: int):
        self.rss, self.reads = rss_kb, 0

    def rss_kb(self) -> int:
        self.reads += 1
        return self.rss


def test_one_rss_reading_between_two_handlers_serves_the_budget_and_admission(make_runtime, monkeypatch):
    rt = make_runtime(CRONBOX_ADMISSION_MEMORY_HEADROOM="8", CRONBOX_CGROUP_ROOT="/nonexistent",
                      CRONBOX_LVE_LIST="/nonexistent")
    probe = CountingProbe(100 * 1024)
    monkeypatch.setattr("cronbox.outbox.engine.budget.PROBE", probe)
    admission = Admission("job", rt.settings)
    admission.book.add("mid", 0.01, 20 * 1024)  # grows 20 MB
    budget = Budget(max_time=None, memory_mb=200)
    budget.start_rss_kb = 50 * 1024
    probe.reads = 0
    assert budget.stop_reason() is None and admission.check("mid", budget) is None
    assert probe.reads == 1  # the check took the stop_reason's reading
    probe.rss = 175 * 1024  # a handler ran and grew the worker: 25 MB left, 17 after the headroom
    budget.record(0.01)
    verdict = admission.check("mid", budget)  # the first of a batch: no stop_reason before it
    assert probe.reads == 2 and verdict.later and "17 MB of --memory" in verdict.reason
    assert admission.check("mid", budget).later and probe.reads == 2  # still no handler since: no new reading
    probe.rss = 100 * 1024
    assert budget.stop_reason() is None and probe.reads == 3  # the budget's own check always reads afresh
    assert admission.check("mid", budget) is None and probe.reads == 3
