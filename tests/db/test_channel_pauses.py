"""Channel pauses seen and lifted by the operator: `queue resume`, `queue status`, `health`, one-off runs.

The console's Resume button is in tests/web/test_console.py.
"""
from __future__ import annotations

import json
from datetime import timedelta

import pytest

from cronbox.cron.scheduling import once as once_requests
from cronbox.outbox.channels import send_sms
from cronbox.outbox.core import clock
from cronbox.outbox.queue import pauses
from cronbox.outbox.queue.models import ChannelPause
from tests.conftest import ONE_MYSQL_MODE
from tests.db.test_channels import T0, dispatch_sms, job, make_runtime, work
from tests.helpers import invoke

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode changes nothing these tests check


@pytest.fixture
def broken_and_fixed(env, runtime):
    """Two runtimes on one database: SMS not configured (Kavenegar without a key: the channel pauses),
    then the operator's fix (the log driver)."""
    broken = make_runtime(env, runtime, CRONBOX_SMS_DRIVER="kavenegar")
    fixed = make_runtime(env, runtime)
    yield broken, fixed
    broken.dispose()
    fixed.dispose()


def pause_row(rt, channel: str = "sms") -> ChannelPause | None:
    with rt.sessions() as session:
        return session.get(ChannelPause, channel)


def test_queue_resume_lifts_the_pause_and_the_held_jobs_run(env, broken_and_fixed):
    broken, fixed = broken_and_fixed
    with clock.frozen(T0):
        held = [dispatch_sms(broken, "+989120000000"), dispatch_sms(broken, "+989120000001")]
        with broken.sessions.begin() as session:  # due after the fix anyway: keeps its own time
            later = send_sms.dispatch(session, {"to": "+989120000002", "text": "tomorrow"}, delay=300)
        assert work(broken).deferred == 2
        assert "Kavenegar is not configured" in pause_row(broken).reason
        clock.advance(10)
        assert work(fixed).done == 0  # fixing the settings alone is not enough: the pause holds them

        result = invoke(env, "queue", "resume", "sms")
        assert result.exit_code == 0, result.output
        assert "channel sms resumed; 2 waiting jobs are due now" in result.output
        assert pause_row(fixed) is None

        stats = work(fixed)
        assert stats.done == 2 and stats.deferred == 0
        for job_id in held:
            row = job(fixed, job_id)
            assert row.status == "done" and row.attempts == 1  # the pause used none of their attempts
        waiting = job(fixed, later)
        assert waiting.status == "ready" and waiting.available_at == T0 + timedelta(seconds=300)
        clock.advance(300)
        assert work(fixed).done == 1


def test_resume_without_the_fix_pauses_again(env, broken_and_fixed):
    broken, _ = broken_and_fixed
    with clock.frozen(T0):
        job_id = dispatch_sms(broken, "+989120000000")
        work(broken)
        clock.advance(60)
        assert invoke(env, "queue", "resume", "sms").exit_code == 0
        assert work(broken).deferred == 1
        assert pause_row(broken).paused_until == T0 + timedelta(seconds=960)
        assert job(broken, job_id).attempts == 0


def test_resume_of_a_channel_not_paused_or_unknown(env, runtime):
    rt = make_runtime(env, runtime)
    try:
        with clock.frozen(T0):
            quiet = invoke(env, "queue", "resume", "sms")
            assert quiet.exit_code == 0 and "channel sms is not paused; nothing to do" in quiet.output
            for name in ("fax", "x" * 300, "sms; DROP TABLE"):
                unknown = invoke(env, "queue", "resume", name)
                assert unknown.exit_code == 2, unknown.output
                assert "no job sends through channel" in unknown.output and "channels: mail, sms" in unknown.output
                assert "Traceback" not in unknown.output
            with rt.sessions.begin() as session:  # an expired pause is not a pause: the row just goes
                pauses.pause(session, "sms", 60, "out of credit", T0 - timedelta(seconds=120))
                pauses.pause(session, "push", 600, "token revoked", T0)  # no job of this app uses it
            expired = invoke(env, "queue", "resume", "sms")
            assert expired.exit_code == 0 and "is not paused" in expired.output and pause_row(rt) is None
            other = invoke(env, "queue", "resume", "push")
            assert other.exit_code == 0 and "channel push resumed; 0 waiting jobs" in other.output
            assert pause_row(rt, "push") is None
    finally:
        rt.dispose()


def test_status_and_health_show_a_pause(env, broken_and_fixed):
    broken, _ = broken_and_fixed
    with clock.frozen(T0):
        dispatch_sms(broken, "+989120000000")
        work(broken)
        clock.advance(100)
        status = invoke(env, "queue", "status")
        assert status.exit_code == 0
        line = next(line for line in status.output.splitlines() if line.startswith("sms ") and "UTC" in line)
        assert "2026-11-30 12:15:00 UTC" in line and "13m20s" in line and "Kavenegar is not configured" in line
        assert "queue resume CHANNEL" in status.output
        report = json.loads(invoke(env, "health", "--json").output)
        [check] = [c for c in report["checks"] if c["name"] == "channel.sms"]
        assert check["status"] == "warn" and check["value"] == 800
        assert "Kavenegar is not configured" in check["detail"] and "queue resume sms" in check["detail"]

        assert invoke(env, "queue", "resume", "sms").exit_code == 0
        assert "paused channels" not in invoke(env, "queue", "status").output
        report = json.loads(invoke(env, "health", "--json").output)
        assert not [c for c in report["checks"] if c["name"].startswith("channel.")]


def test_resume_is_allowed_as_a_one_off_run():
    assert once_requests.allowed(["queue", "resume", "sms"]) is None
