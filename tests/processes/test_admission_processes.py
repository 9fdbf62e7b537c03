"""Admission in real `python -m cronbox queue work` processes: a 60 MB handler under --memory 96 once its
profile exists, and a job whose profile does not fit the rest of --max-time."""
from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import select, update

from cronbox.outbox.core import clock
from cronbox.outbox.engine.models import HandlerProfile
from cronbox.outbox.queue.models import Job
from tests.conftest import run_cli
from tests.handlers import admission_jobs

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")


@pytest.fixture
def admission_env(env, tmp_path):
    inside = tmp_path / "inside"
    inside.mkdir()
    return {**env, "CRONBOX_HANDLERS": "tests.handlers.admission_jobs", "TEST_INSIDE_DIR": str(inside)}


def dispatch(runtime, handler, **payload) -> int:
    with runtime.sessions.begin() as session:
        return handler.dispatch(session, payload)


def job(runtime, job_id: int) -> Job:
    with runtime.sessions() as session:
        return session.get(Job, job_id)


def profile(runtime, handler: str) -> HandlerProfile:
    with runtime.sessions() as session:
        return session.scalars(select(HandlerProfile).where(HandlerProfile.handler == handler)).one()


def logs(runtime) -> str:
    return "".join(p.read_text() for p in sorted(runtime.settings.logs_dir.glob("cronbox-*.log")))


def work(env, *args: str):
    proc = run_cli(env, "queue", "work", "--queue", "admission", "--stop-when-empty", *args)
    return proc, proc.stdout + proc.stderr


# The max-time test's run: --max-time MAX_TIME (headroom 1 s), a first job of BEFORE seconds, then one
# whose profile says SLOW: MAX_TIME - BEFORE - 1 < SLOW < MAX_TIME - 1, with room on both sides.
MAX_TIME, BEFORE, SLOW = 10, 2, 7.5


def test_a_60_mb_handler_near_the_memory_limit_is_deferred_and_runs_with_headroom(runtime, admission_env, tmp_path):
    first = dispatch(runtime, admission_jobs.alloc, n=1)
    proc, out = work(admission_env, "--memory", "256")  # no profile yet: it runs, and is measured
    assert proc.returncode == 0 and job(runtime, first).status == "done", out
    learnt = profile(runtime, "admission.alloc")
    assert learnt.runs == 1 and learnt.rss_growth_kb >= 55 * 1024, (learnt.runs, learnt.samples, logs(runtime)[-3000:])  # the peak, freed after

    # A worker that grew 50 MB during its run (the ballast job first): 60 more would pass --memory 160.
    grown = dispatch(runtime, admission_jobs.ballast, n=2)
    second = dispatch(runtime, admission_jobs.alloc, n=2)
    proc, out = work(admission_env, "--memory", "160")
    assert proc.returncode == 0 and "stopped: memory" in out and "1 deferred" in out, out
    assert "handler=admission.alloc deferred: grows RSS by" in logs(runtime) and "given back" in logs(runtime)
    kept = job(runtime, second)
    assert job(runtime, grown).status == "done"
    assert kept.status == "ready" and kept.attempts == 0 and not (tmp_path / "inside" / "alloc-2").exists()
    assert kept.available_at <= clock.utcnow()  # due at once: the next (fresh) run fits it
    assert profile(runtime, "admission.alloc").never_fits is None

    # --memory 96: even a fresh worker (~50 MB: the interpreter, Flask, SQLAlchemy) has no room for 60 MB.
    proc, out = work(admission_env, "--memory", "96")
    assert proc.returncode == 0 and "1 deferred" in out and "stopped: empty" in out, out
    kept = job(runtime, second)
    assert kept.status == "ready" and kept.attempts == 0 and not (tmp_path / "inside" / "alloc-2").exists()
    marked = profile(runtime, "admission.alloc").never_fits
    assert "more than --memory 96 MB minus 8 MB headroom" in marked, marked
    status = run_cli(admission_env, "queue", "status").stdout
    assert "never fits: admission.alloc (job" in status, status

    with runtime.sessions.begin() as session:  # its wait (5 minutes) is over
        session.execute(update(Job).where(Job.id == second).values(available_at=clock.utcnow()))
    proc, out = work(admission_env, "--memory", "256")  # enough headroom: it runs
    assert proc.returncode == 0 and job(runtime, second).status == "done", out
    again = profile(runtime, "admission.alloc")
    assert again.runs == 2 and again.never_fits is None  # a run that took it clears the mark


def test_a_job_whose_profile_does_not_fit_the_rest_of_max_time_is_not_started(runtime, admission_env, tmp_path):
    dispatch(runtime, admission_jobs.slow, n=1, seconds=SLOW)
    proc, out = work(admission_env)  # no --max-time: the profile learns SLOW seconds
    assert proc.returncode == 0 and profile(runtime, "admission.slow").duration_ms >= SLOW * 1000, out
    (tmp_path / "inside" / "slow-1").unlink()

    before = dispatch(runtime, admission_jobs.sleep, n=2, seconds=BEFORE)  # no profile: admitted, uses BEFORE
    late = dispatch(runtime, admission_jobs.slow, n=3, seconds=SLOW)
    # --max-time 10 keeps 1 s (the setting; a tenth is no less): after the first job at most
    # 10 - 2 - 1 = 7 s are left, and the slow one needs 7.5 however fast the machine. A fresh run
    # fits it (9 s), with 1.5 s to spare for a loaded machine's longer measure of it: not "never".
    # The run goes on to ask at all while its time, minus the headroom and the average so far (2 s),
    # is not up: 5 s for the start-up and the first job's overhead, where 4 s and 1 s left 1.6.
    proc, out = work({**admission_env, "CRONBOX_ADMISSION_TIME_HEADROOM": "1s"}, "--max-time", str(MAX_TIME))
    assert proc.returncode == 0 and "stopped: max-time" in out, out
    assert job(runtime, before).status == "done"
    kept = job(runtime, late)
    assert kept.status == "ready" and kept.attempts == 0 and not (tmp_path / "inside" / "slow-3").exists(), out
    samples = json.loads(profile(runtime, "admission.slow").samples)
    assert len(samples) == 1  # it never ran again
    # Deferred for later (the rest of this run), not marked as never fitting; the average is what the
    # first run measured, a little more than SLOW on a loaded machine.
    deferred = re.search(r"handler=admission\.slow deferred: runs (\d+\.\d)s on average; [\d.]+s of --max-time left",
                         logs(runtime))
    assert deferred and SLOW <= float(deferred.group(1)) < MAX_TIME - 1, logs(runtime)[-3000:]
    assert profile(runtime, "admission.slow").never_fits is None


def test_a_bad_admission_setting_is_one_line_and_an_error_exit(runtime, admission_env):
    proc, out = work({**admission_env, "CRONBOX_PROFILE_WINDOW": "none"})
    assert proc.returncode != 0 and "CRONBOX_PROFILE_WINDOW='none' is not a number" in out and "Traceback" not in out
