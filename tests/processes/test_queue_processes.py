"""Workers as cron starts them: several at once, crashes at every boundary, SIGTERM, killed connections."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from cronbox.outbox.core.faults import CRASH_EXIT_CODE
from cronbox.outbox.engine.registry import DEFAULT, Registry
from cronbox.outbox.queue.models import Job
from tests.conftest import MYSQL_BACKENDS, child_env, run_cli
from tests.helpers import cronbox_log, run_until, table_column, wait_for
from tests.handlers import jobs as test_jobs
from tests.handlers.effects import effects, metadata as effects_metadata
from tests.processes.test_tick import LEASE

HANDLERS = "tests.handlers.jobs"


@pytest.fixture
def job_env(env, runtime, tmp_path):
    effects_metadata.create_all(runtime.engine)
    runs = tmp_path / "runs"
    runs.mkdir()
    return {**env, "CRONBOX_HANDLERS": HANDLERS, "TEST_RUNS_DIR": str(runs)}


def dispatch(runtime, handler, count: int) -> None:
    with runtime.sessions.begin() as session:
        for n in range(count):
            handler.dispatch(session, {"n": n})


def job_rows(runtime) -> list[Job]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def clean_work(job_env) -> None:
    proc = run_cli(job_env, "queue", "work", "--stop-when-empty")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def unfinished(runtime) -> int:
    with runtime.sessions() as session:
        return session.scalar(select(func.count()).select_from(Job).where(Job.status != "done"))


def read_runs(folder: Path) -> list[tuple[int, int, int, float, float]]:
    runs = []
    for path in folder.glob("runs-*.txt"):
        for line in path.read_text().split("\n"):
            if line:
                n, attempt, pid, start, end = line.split()
                runs.append((int(n), int(attempt), int(pid), float(start), float(end)))
    return runs


def start_workers(job_env, count: int, *args) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "cronbox", "queue", "work", "--stop-when-empty", *args],
                             env=child_env(job_env), cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(count)]


@pytest.mark.slow
@pytest.mark.backends(*MYSQL_BACKENDS, "postgresql")
@pytest.mark.parametrize("workers", [2, 4])
def test_concurrent_workers_drain_1000_jobs_without_overlap(runtime, job_env, tmp_path, workers):
    dispatch(runtime, test_jobs.record_run.job, 1000)
    # 3 ms per job: the drain outlasts a worker's start-up, so all of them compete for jobs.
    procs = start_workers({**job_env, "TEST_SLEEP": "0.003"}, workers)
    outputs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * workers, outputs
    assert all("stopped: empty" in out for out, _ in outputs), outputs
    assert "Traceback" not in "".join(err for _, err in outputs)
    runs = read_runs(tmp_path / "runs")
    assert unfinished(runtime) == 0
    assert sorted(n for n, *_ in runs) == list(range(1000))  # every job ran, exactly once here
    by_job = defaultdict(list)
    for n, _attempt, _pid, start, end in runs:
        by_job[n].append((start, end))
    for intervals in by_job.values():  # no two runs of one job overlap
        intervals.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(intervals, intervals[1:]))
    assert len({pid for _, _, pid, _, _ in runs}) >= 2  # the work was really shared


@pytest.mark.slow
@pytest.mark.parametrize("step", ["after-claim", "in-handler", "before-ack-commit", "after-ack-commit"])
def test_crash_at_every_boundary_every_job_completes(runtime, job_env, step):
    dispatch(runtime, test_jobs.write.job, 8)
    rng = random.Random(f"jobs-{step}-{runtime.settings.database_url[:5]}")
    crashes = 0
    for nth in [rng.randint(1, 4) for _ in range(4)]:
        proc = run_cli(job_env, "queue", "work", "--stop-when-empty", CRONBOX_CRASH_AT=f"{step}:{nth}")
        assert proc.returncode in (0, CRASH_EXIT_CODE), proc.stdout + proc.stderr
        crashes += proc.returncode == CRASH_EXIT_CODE
        time.sleep(LEASE)
    run_until(lambda: clean_work(job_env), lambda: unfinished(runtime) == 0, pause=LEASE)
    assert crashes >= 2
    assert unfinished(runtime) == 0
    with runtime.sessions() as session:
        counts = Counter(dict(session.execute(select(effects.c.event_id, func.count())
                                              .group_by(effects.c.event_id)).all()))
    assert counts == Counter({n: 1 for n in range(8)})  # database effects exactly once


@pytest.mark.slow
def test_random_sigkills_every_job_completes(runtime, job_env, tmp_path):
    dispatch(runtime, test_jobs.record_run.job, 80)
    rng = random.Random(7)
    env = child_env({**job_env, "TEST_SLEEP": "0.01"})
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-m", "cronbox", "queue", "work", "--stop-when-empty"], env=env,
                                cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.6, 1.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(LEASE)
    run_until(lambda: clean_work(job_env), lambda: unfinished(runtime) == 0, pause=LEASE)
    assert unfinished(runtime) == 0
    assert set(n for n, *_ in read_runs(tmp_path / "runs")) == set(range(80))


@pytest.mark.slow
def test_a_job_that_kills_the_worker_every_time_ends_failed(runtime, job_env):
    dispatch(runtime, test_jobs.poison.job, 1)
    codes = []
    for _ in range(6):
        proc = run_cli(job_env, "queue", "work", "--stop-when-empty")
        codes.append(proc.returncode)
        if proc.returncode == 0:
            break
        time.sleep(LEASE)
    assert codes == [9, 9, 9, 0]  # the fourth claim finds the tries used up and fails it without running
    [row] = job_rows(runtime)
    # The attempts that ran (tries=3), everywhere: the row, its error, the log line, `queue failed` (issue 35:
    # the fourth claim's attempt, which never runs, was kept: `attempts 4` beside "attempt 3 of 3").
    assert row.status == "failed" and row.attempts == 3
    assert row.last_error.startswith("gave up: attempt 3 of 3 was claimed but never finished")
    assert "outcome=failed attempt=3/3" in cronbox_log(runtime)
    listed = run_cli(job_env, "queue", "failed")
    assert table_column(listed.stdout, "attempts") == ["3"] and "attempt 3 of 3" in listed.stdout, listed.stdout


def test_sigterm_finishes_the_current_job_and_releases_the_rest_at_once(runtime, job_env, tmp_path):
    dispatch(runtime, test_jobs.block.job, 1)
    dispatch(runtime, test_jobs.record_run.job, 5)
    inside, release = tmp_path / "inside", tmp_path / "release"
    env = {**job_env, "TEST_INSIDE_FILE": str(inside), "TEST_RELEASE_FILE": str(release)}
    [proc] = start_workers(env, 1)
    wait_for(inside.exists, "the blocking job to start")
    proc.send_signal(signal.SIGTERM)
    # Once the worker took the signal (its log says so), not a fixed 0.3 s after it was sent, which a
    # loaded machine could pass before the signal was handled: then nothing would be checked.
    wait_for(lambda: "received SIGTERM" in cronbox_log(runtime), "the worker to take the SIGTERM")
    assert proc.poll() is None  # still finishing the job
    release.write_text("go")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "1 jobs (1 done" in out and "stopped: signal" in out
    rows = job_rows(runtime)
    assert rows[0].status == "done"
    assert all(r.status == "ready" and r.claim_token is None and r.attempts == 0 for r in rows[1:])


@pytest.mark.backends(*MYSQL_BACKENDS, "postgresql")
def test_killed_database_connection_worker_reconnects_and_finishes(runtime, job_env, tmp_path, request, database):
    dispatch(runtime, test_jobs.record_run.job, 30)
    env = {**job_env, "TEST_SLEEP": "0.1"}
    [proc] = start_workers(env, 1, "--max-time", "60")
    wait_for(lambda: len(read_runs(tmp_path / "runs")) >= 3, "a few jobs to run")
    if database.is_postgresql:  # every backend on the database: the worker's work connection among them
        with request.getfixturevalue("postgres_admin").connect() as connection:
            ids = connection.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                                          "datname = :db AND pid != pg_backend_pid()"), {"db": database.name}).all()
    else:
        with request.getfixturevalue("mysql_admin").connect() as connection:
            ids = connection.execute(text("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = :db AND ID != "
                                          "CONNECTION_ID()"), {"db": database.name}).scalars().all()
            for conn_id in ids:
                connection.execute(text(f"KILL {int(conn_id)}"))
    assert ids
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, out + err
    assert "stopped: empty" in out
    assert unfinished(runtime) == 0
    assert set(n for n, *_ in read_runs(tmp_path / "runs")) == set(range(30))
    logs = "".join(p.read_text() for p in runtime.settings.logs_dir.glob("cronbox-*.log"))
    assert "database connection lost" in logs


def test_registry_of_the_test_module_is_the_global_one():
    """The subprocess handlers register in the process-wide registry (as CRONBOX_HANDLERS modules do)."""
    assert DEFAULT.jobs.get("jobs.record") is test_jobs.record_run.job


@pytest.mark.slow
def test_a_killer_job_in_a_batch_does_not_use_up_its_batch_mates(runtime, job_env):
    """The poison job kills the worker at every attempt; the jobs claimed with it must not pay an
    attempt per crash (they were never started), nor be failed with it."""
    with runtime.sessions.begin() as session:
        for n in range(3):
            test_jobs.write.job.dispatch(session, {"n": n})
        test_jobs.poison.job.dispatch(session, {"n": 99})
        for n in range(3, 6):
            test_jobs.write.job.dispatch(session, {"n": n})
    codes = []
    for _ in range(8):
        proc = run_cli(job_env, "queue", "work", "--stop-when-empty")
        codes.append(proc.returncode)
        if proc.returncode == 0:
            break
        time.sleep(LEASE)
    assert codes[-1] == 0 and codes.count(9) == 3
    rows = job_rows(runtime)
    poison = next(r for r in rows if r.handler == "jobs.poison")
    others = [r for r in rows if r.handler == "jobs.write"]
    assert poison.status == "failed"
    assert all(r.status == "done" for r in others)
    assert max(r.attempts for r in others) <= 2  # the first crash's claim, then their own run


def test_a_timeout_is_not_swallowed_by_the_handlers_own_except(runtime):
    from cronbox.outbox.engine.budget import Budget
    from cronbox.outbox.queue.jobs import job
    from cronbox.outbox.queue.worker import Worker

    registry = Registry()

    @job(name="stubborn", timeout=0.3, tries=1, registry=registry)
    def stubborn(payload, ctx):
        try:
            time.sleep(60)
        except Exception:  # a handler's blanket except must not eat the timer
            pass
        time.sleep(60)

    runtime.registry = registry
    with runtime.sessions.begin() as session:
        stubborn.dispatch(session, {})
    started = time.monotonic()
    Worker(runtime).run(Budget(max_time=180, memory_mb=None))
    assert time.monotonic() - started < 30  # the timer ended the second sleep too: not 60 s, nor 120
    [row] = job_rows(runtime)
    assert row.status == "failed" and "HandlerTimeout" in row.last_error
