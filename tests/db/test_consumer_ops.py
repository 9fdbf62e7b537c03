"""The consumer side's operations: health sees an `amqp consume` run that died (its heartbeat row
stays "running" and stops beating), and retention prunes the inbox after its window. Rows are
written the way the consumer writes them (outbox.engine.heartbeat, outbox.events.inbox); one test
SIGKILLs a real process that beats."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from cronbox.cron.scheduling import health, retention
from cronbox.outbox.core import clock
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine import heartbeat
from cronbox.outbox.engine.heartbeat import BEAT_SECONDS, STALE_BEATS
from cronbox.outbox.events import redeliveries
from tests.broker_rows import add_inbox_row, inbox_count, inbox_has, redelivery_times
from tests.conftest import APP_ROOT, child_env

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

T0 = datetime(2026, 12, 1, 9, 0, 0)
STALE = BEAT_SECONDS * STALE_BEATS


def consumer_checks(runtime) -> dict[str, health.Check]:
    return {c.name: c for c in health.run_checks(runtime).checks if c.name.startswith("consumer.")}


def test_no_consume_runs_no_check(runtime):
    heartbeat.finish(runtime.sessions, heartbeat.start(runtime.sessions, "tick"), outcome="empty")
    assert consumer_checks(runtime) == {}


def test_a_consumer_that_stops_beating_fails_one_that_ended_with_an_error_warns(runtime):
    with clock.frozen(T0):
        alive = heartbeat.start(runtime.sessions, "amqp consume", detail="orders", beats=True)
        heartbeat.start(runtime.sessions, "amqp consume", detail="lab", beats=True)
        crashed = heartbeat.start(runtime.sessions, "amqp consume", detail="billing", beats=True)
        heartbeat.finish(runtime.sessions, crashed, outcome="error", error="ConnectionError: broker gone")
        clean = heartbeat.start(runtime.sessions, "amqp consume", detail="audit", beats=True)
        heartbeat.finish(runtime.sessions, clean, outcome="max-messages")
        checks = consumer_checks(runtime)
        assert {n: c.status for n, c in checks.items()} == {
            "consumer.orders": "ok", "consumer.lab": "ok", "consumer.billing": "warn", "consumer.audit": "ok"}
        assert "broker gone" in checks["consumer.billing"].detail

        clock.advance(STALE - 1)
        heartbeat.beat(runtime.sessions, alive, delivered=5)
        clock.advance(2)  # "lab" last beat STALE + 1 s ago; "orders" 2 s ago
        checks = consumer_checks(runtime)
        assert checks["consumer.orders"].status == "ok"
        lab = checks["consumer.lab"]
        assert lab.status == "fail" and lab.value == STALE + 1
        assert all(part in lab.detail for part in ("lab", socket.gethostname(), "no beat for 31s", "pid "))
        assert health.run_checks(runtime).status == "fail"

        # A new run for the queue replaces the dead one as the one judged.
        heartbeat.start(runtime.sessions, "amqp consume", detail="lab", beats=True)
        assert consumer_checks(runtime)["consumer.lab"].status == "ok"


def test_a_sigkilled_consumer_process_fails_health(runtime, env):
    """A real process writes its row and beats as `amqp consume` does, then is SIGKILLed (no
    finish): once STALE_BEATS beats are missed, health fails with its pid."""
    script = ("import sys, time\n"
              "from cronbox.outbox.core.settings import load_settings\n"
              "from cronbox.outbox.engine.runtime import Runtime\n"
              "from cronbox.outbox.engine import heartbeat\n"
              "rt = Runtime(load_settings())\n"
              "row = heartbeat.start(rt.sessions, 'amqp consume', detail='lab', beats=True)\n"
              "heartbeat.beat(rt.sessions, row, delivered=1)\n"
              "print('beating', flush=True)\n"
              "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env=child_env(env), cwd=str(APP_ROOT),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "beating"
        check = consumer_checks(runtime)["consumer.lab"]
        assert check.status == "ok" and f"pid {proc.pid}" in check.detail
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    with clock.frozen(clock.utcnow() + timedelta(seconds=STALE + 5)):
        check = consumer_checks(runtime)["consumer.lab"]
    assert check.status == "fail" and f"pid {proc.pid}" in check.detail


def test_retention_keeps_a_long_running_consumers_row_while_it_beats(runtime):
    with clock.frozen(T0):
        running = heartbeat.start(runtime.sessions, "amqp consume", detail="orders", beats=True)
        old_tick = heartbeat.start(runtime.sessions, "tick")
        heartbeat.finish(runtime.sessions, old_tick, outcome="empty")
        clock.advance(8 * 86400)
        heartbeat.beat(runtime.sessions, running)
        assert retention.prune_all(runtime)["heartbeats"] == 1  # the tick's; the beating consumer stays
        assert consumer_checks(runtime)["consumer.orders"].status == "ok"


def test_inbox_rows_are_pruned_after_the_retention_window_in_batches(runtime, monkeypatch):
    monkeypatch.setattr(retention, "BATCH", 3)
    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            for n in range(7):
                add_inbox_row(session, "billing", f"old-{n}", clock.utcnow())
        clock.advance(10 * 86400)
        with runtime.sessions.begin() as session:
            add_inbox_row(session, "billing", "recent", clock.utcnow())
        clock.advance(4 * 86400 - 1)  # the old rows are 14 days old less a second: kept
        assert retention.prune_all(runtime)["inbox rows"] == 0
        clock.advance(2)
        assert retention.prune_all(runtime)["inbox rows"] == 7  # three batches
        with runtime.sessions() as session:
            assert inbox_count(session) == 1 and inbox_has(session, "billing", "recent")
        # A shorter window, from CRONBOX_INBOX_RETENTION_DAYS.
        monkeypatch.setattr(runtime, "settings", replace(runtime.settings, inbox_retention_days=3))
        assert retention.prune_all(runtime)["inbox rows"] == 1


def test_redelivery_counts_rise_per_message_go_when_forgotten_and_leftovers_are_pruned_with_the_inbox(runtime):
    with clock.frozen(T0):
        for expected in (1, 2, 3):
            assert in_transaction(runtime.sessions, lambda s: redeliveries.count(s, "orders", "m-1", clock.utcnow())) \
                == expected
        in_transaction(runtime.sessions, lambda s: redeliveries.count(s, "other", "m-1", clock.utcnow()))
        in_transaction(runtime.sessions, lambda s: redeliveries.count(s, "orders", "m-2", clock.utcnow()))
        with runtime.sessions.begin() as session:
            assert redelivery_times(session, "orders", "m-1") == 3  # per (queue, message)
            assert redelivery_times(session, "other", "m-1") == 1
            redeliveries.forget(session, "orders", "m-2")
            assert redelivery_times(session, "orders", "m-2") == 0
        clock.advance(14 * 86400 - 1)
        assert retention.prune_all(runtime)["redelivery counts"] == 0
        in_transaction(runtime.sessions, lambda s: redeliveries.count(s, "other", "m-1", clock.utcnow()))  # seen again
        clock.advance(2)
        assert retention.prune_all(runtime)["redelivery counts"] == 1  # orders/m-1: a crash's leftover
        with runtime.sessions() as session:
            assert redelivery_times(session, "orders", "m-1") == 0
            assert redelivery_times(session, "other", "m-1") == 2


def test_the_inbox_window_setting(env):
    assert load_settings(environ=env).inbox_retention_days == 14
    assert load_settings(environ={**env, "CRONBOX_INBOX_RETENTION_DAYS": "30"}).inbox_retention_days == 30
    with pytest.raises(Exception, match="CRONBOX_INBOX_RETENTION_DAYS"):
        load_settings(environ={**env, "CRONBOX_INBOX_RETENTION_DAYS": "0"})
