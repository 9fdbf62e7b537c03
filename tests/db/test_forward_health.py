"""A forward target failing for longer than a stated time (the broker down, the port closed) is a
health warning, then a failure, and the tick says so in one stderr line: the tick itself exits 0 and
`outbox status` was the only place the backlog showed. Never the broker's password."""
from __future__ import annotations

import socket
import time
from datetime import datetime, timedelta

import pytest

from cronbox import outbox
import cronbox
from cronbox.cron.scheduling import health
from cronbox.outbox.core import clock
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events.relay import Relay
from tests.conftest import run_cli
from tests.rabbit import url

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

T0 = datetime(2026, 12, 1, 9, 0, 0)
SECRET = "s3cret-pw"


def closed_port() -> int:
    hole = socket.create_server(("127.0.0.1", 0))
    port = hole.getsockname()[1]
    hole.close()
    return port


def down_url(vhost: str) -> str:
    return url(vhost, closed_port()).replace("guest:guest@", f"guest:{SECRET}@")


def forward_checks(runtime) -> dict[str, health.Check]:
    return {c.name: c for c in health.run_checks(runtime).checks if c.name.startswith("forward")}


def record(runtime, count: int, event_type: str = "e") -> None:
    with runtime.sessions.begin() as session:
        for n in range(count):
            cronbox.record(session, event_type, {"n": n})


def test_a_target_failing_past_the_thresholds_warns_then_fails_and_never_shows_the_password(
        runtime, registry, settings, amqp_vhost):
    settings.raw["CRONBOX_AMQP_URL"] = down_url(amqp_vhost)
    cronbox.forward("*", exchange="clinic", name="to-broker", registry=registry, backoff=[30])
    cronbox.forward("other.*", exchange="clinic", name="quiet", registry=registry)  # nothing to send: no check
    with clock.frozen(T0):
        record(runtime, 3)
        relay = Relay(runtime)
        relay.run(Budget(max_time=10, memory_mb=None))
        relay.close()
        assert relay.stats.retried == 3
        assert forward_checks(runtime) == {}  # failing, but not for long yet
        for minutes, grade in ((9, None), (11, "warn"), (59, "warn"), (61, "fail")):
            clock.advance(minutes * 60 - (clock.utcnow() - T0).total_seconds())
            checks = forward_checks(runtime)
            if grade is None:
                assert checks == {}
                continue
            assert list(checks) == ["forward.to-broker"] and checks["forward.to-broker"].status == grade
            detail = checks["forward.to-broker"].detail
            assert f"failing for {minutes} min (3 deliveries waiting): broker unreachable" in detail
            assert SECRET not in detail and "cronbox_test_" in detail
        assert health.run_checks(runtime).status == "fail"


@pytest.mark.parametrize("warn, fail, expected", [("1m", "2m", {1: None, 2: "warn", 3: "fail"}),
                                                  ("90s", "1h", {1: None, 2: "warn", 61: "fail"})])
def test_the_thresholds_are_settings(runtime, registry, settings, amqp_vhost, warn, fail, expected):
    settings.raw.update({"CRONBOX_AMQP_URL": down_url(amqp_vhost), "CRONBOX_FORWARD_WARN_AFTER": warn,
                         "CRONBOX_FORWARD_FAIL_AFTER": fail})
    cronbox.forward("*", exchange="clinic", name="to-broker", registry=registry)
    with clock.frozen(T0):
        record(runtime, 1)
        Relay(runtime).run(Budget(max_time=10, memory_mb=None))
        for minutes, grade in expected.items():
            clock.advance(minutes * 60 - (clock.utcnow() - T0).total_seconds())
            check = forward_checks(runtime).get("forward.to-broker")
            assert (check.status if check else None) == grade, minutes


@pytest.mark.parametrize("value", ["soon", "-5m", "0s", "10 parsecs", "400d"])
def test_a_threshold_that_is_not_a_duration_is_one_warning_naming_it(runtime, registry, settings, value):
    settings.raw["CRONBOX_FORWARD_WARN_AFTER"] = value
    cronbox.forward("*", exchange="clinic", name="to-broker", registry=registry)
    check = forward_checks(runtime)["forward"]
    assert check.status == "warn" and "CRONBOX_FORWARD_WARN_AFTER" in check.detail


def test_a_tick_with_the_broker_down_says_so_in_one_stderr_line(runtime, env, amqp_vhost, tmp_path):
    env = {**env, "CRONBOX_HANDLERS": "tests.handlers.forwarding", "TEST_AMQP_EXCHANGE": "clinic",
           "CRONBOX_AMQP_URL": down_url(amqp_vhost)}
    with runtime.sessions.begin() as session:
        cronbox.record(session, "fwd.n", {"n": 1})
    quiet = run_cli(env, "tick", "--no-linger")  # failing, but not for 10 minutes yet
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr[-2000:]
    time.sleep(1.1)
    loud = run_cli({**env, "CRONBOX_FORWARD_WARN_AFTER": "1s"}, "tick", "--no-linger")
    lines = loud.stderr.strip().splitlines()
    assert loud.returncode == 0 and len(lines) == 1, loud.stderr[-2000:]
    assert lines[0].startswith("warning: forward target 'to-broker' failing for 0 min (1 deliveries waiting): "
                               "broker unreachable")
    assert SECRET not in loud.stderr + loud.stdout
    bad = run_cli({**env, "CRONBOX_FORWARD_WARN_AFTER": "soon"}, "tick", "--no-linger")
    # A bad threshold is a settings error like any duration's: every command stops at once, in one line.
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr[-2000:]
    assert "CRONBOX_FORWARD_WARN_AFTER=soon" in bad.stderr and "Traceback" not in bad.stderr
