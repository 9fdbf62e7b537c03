"""The queue commands: status, failed, retry, forget, flush, prune, work's options and summary; the tick drains."""
from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import select

from cronbox.cron.cli import main
from cronbox.cron.scheduling.tick import run_tick
from cronbox.outbox.core import clock
from cronbox.outbox.engine.registry import DEFAULT, Jobs
from cronbox.outbox.queue.models import Job
from tests.handlers import jobs as test_jobs  # noqa: F401  (registers jobs.* in the global registry)
from tests.helpers import invoke
from tests.processes.test_queue_processes import dispatch, job_env  # noqa: F401  (fixture)

T0 = datetime(2026, 11, 30, 12, 0, 0)


def statuses(runtime) -> list[str]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Job.status).order_by(Job.id)))


def fail_all(runtime) -> list[int]:
    with runtime.sessions.begin() as session:
        session.execute(Job.__table__.update().values(status="failed", available_at=None, attempts=3,
                                                      last_error="RuntimeError: no", error_class="RuntimeError",
                                                      finished_at=clock.utcnow()))
        return list(session.scalars(select(Job.id).order_by(Job.id)))


def test_status_failed_retry_forget_flush(runtime, job_env):
    env = {**job_env, "CRONBOX_HANDLERS": "tests.handlers.jobs"}
    dispatch(runtime, test_jobs.write.job, 4)
    result = invoke(env, "queue", "status")
    assert result.exit_code == 0
    default = next(line for line in result.output.splitlines() if line.startswith("default "))
    assert default.split()[:5] == ["default", "4", "0", "0", "0"]

    ids = fail_all(runtime)
    failed = invoke(env, "queue", "failed")
    assert all(str(i) in failed.output for i in ids) and "RuntimeError: no" in failed.output

    retried = invoke(env, "queue", "retry", str(ids[0]), "999999")
    assert retried.exit_code == 1
    assert "1 jobs queued again" in retried.output and "unknown failed job id(s): 999999" in retried.output
    assert statuses(runtime) == ["ready", "failed", "failed", "failed"]
    with runtime.sessions() as session:
        assert session.get(Job, ids[0]).attempts == 0  # fresh attempts

    assert invoke(env, "queue", "retry", "--all", "--queue", "elsewhere").output.startswith("retry: 0 jobs")
    forgot = invoke(env, "queue", "forget", str(ids[1]))
    assert forgot.exit_code == 0 and "1 failed jobs deleted" in forgot.output
    flushed = invoke(env, "queue", "flush")
    assert flushed.exit_code == 0 and "2 failed jobs deleted" in flushed.output
    assert statuses(runtime) == ["ready"]
    assert invoke(env, "queue", "retry", "--all").output.startswith("retry: 0 jobs")


def test_flush_older_than_and_prune(runtime, job_env):
    env = job_env
    with clock.frozen(T0):
        dispatch(runtime, test_jobs.write.job, 3)
        fail_all(runtime)
        clock.advance(11 * 86400)
        dispatch(runtime, test_jobs.write.job, 2)
        assert invoke(env, "queue", "work", "--stop-when-empty").exit_code == 0
        fail_ids = [j for j in statuses(runtime)]
        assert fail_ids == ["failed"] * 3 + ["done"] * 2
        assert "3 failed jobs deleted" in invoke(env, "queue", "flush", "--older-than", "10d").output
        assert "0 done jobs" in invoke(env, "queue", "prune", "--older-than", "48h").output
        clock.advance(3 * 86400)
        assert "2 done jobs" in invoke(env, "queue", "prune").output
    assert statuses(runtime) == []


@pytest.mark.parametrize("args, ran, reason", [
    (["--stop-when-empty"], 5, "empty"),
    (["--once"], 1, "max-jobs"),
    (["--max-jobs", "3", "--stop-when-empty"], 3, "max-jobs"),
    (["--memory", "8", "--stop-when-empty"], 0, "memory"),
])
def test_work_options_and_summary(runtime, job_env, args, ran, reason):
    dispatch(runtime, test_jobs.write.job, 5)
    result = invoke(job_env, "queue", "work", *args)
    assert result.exit_code == 0, result.output
    assert f"queue work: {ran} jobs ({ran} done" in result.output and f"stopped: {reason}" in result.output


def test_work_max_time_ends_a_polling_worker(runtime, job_env):
    result = invoke(job_env, "queue", "work", "--max-time", "1.5", "--sleep", "0.2")
    assert result.exit_code == 0 and "stopped: max-time" in result.output


@pytest.mark.parametrize("args, message", [
    (["queue", "work", "--queue", "a,,b b"], "is not a comma-separated list of queue names"),
    (["queue", "retry"], "give job ids or --all"),
    (["queue", "flush", "--older-than", "soon"], "is not a duration"),
    (["queue", "work", "--max-jobs", "0"], "0 is not in the range"),
])
def test_queue_usage_errors(runtime, job_env, args, message):
    result = invoke(job_env, *args)
    assert result.exit_code == 2 and message in result.output


def test_no_queues_to_work(runtime, env, monkeypatch):
    monkeypatch.setattr(DEFAULT, "jobs", Jobs("job"))  # no job registered in this process
    result = invoke({**env, "CRONBOX_HANDLERS": ""}, "queue", "work", "--stop-when-empty")
    assert result.exit_code == 2 and "no queues to work" in result.output


def test_the_tick_drains_the_queues_after_the_relay(runtime, job_env):
    runtime.registry = DEFAULT
    dispatch(runtime, test_jobs.write.job, 3)
    report = run_tick(runtime, run_command=main, max_time=10, linger=False, memory_mb=4096)  # pytest itself is past 96 MB
    assert report.worker.stats.done == 3
    assert "jobs done 3" in report.summary()
    assert statuses(runtime) == ["done"] * 3


def test_queue_resume_as_cron_runs_it(runtime, env):
    """A real process: one line, exit 2 for a channel nothing sends through, 0 for one not paused, then a pause
    lifted (the alert and the held jobs are in tests/db/test_channel_pauses.py)."""
    from cronbox.outbox.queue import pauses
    from tests.conftest import run_cli

    unknown = run_cli(env, "queue", "resume", "fax")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert unknown.stderr.strip().splitlines() == [
        "error: no job sends through channel 'fax' (channels: mail, sms, webhook) (see `python -m cronbox queue resume --help`)"]
    quiet = run_cli(env, "queue", "resume", "mail")
    assert quiet.returncode == 0 and quiet.stdout.strip() == "queue resume: channel mail is not paused; nothing to do"
    with runtime.sessions.begin() as session:
        pauses.pause(session, "mail", 900, "SMTP login refused (535)", clock.utcnow())
    lifted = run_cli(env, "queue", "resume", "mail")
    assert lifted.returncode == 0 and "channel mail resumed; 0 waiting jobs are due now" in lifted.stdout
    with runtime.sessions() as session:
        assert pauses.active(session, clock.utcnow()) == []
