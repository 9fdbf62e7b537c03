"""A tick forwarding while the broker is under a resource alarm (connection.blocked on every
connection, played by the proxy: tests/db/test_forward_blocked.py): the tick ends by its --max-time,
its jobs run, nothing is written into the blocked connections, and the deliveries, retried later,
all arrive once."""
from __future__ import annotations

import pytest
from sqlalchemy import select

from cronbox.outbox.events.models import Delivery
from tests.processes.test_forward_processes import (  # noqa: F401
    PAST_MAX_TIME, _tick_with_jobs, check_arrivals, finish, fwd_env, record)
from tests.rabbit import url
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")


def test_a_tick_forwarding_into_a_blocked_broker_ends_in_time_and_loses_nothing(fwd_env, runtime, rabbit, tmp_path):
    env, queue = fwd_env
    recorded = record(runtime, 6)
    with TcpProxy(5672, amqp=True) as proxy:
        proxy.block_new = True
        proc, took = _tick_with_jobs(env, runtime, tmp_path, url(rabbit.vhost, proxy.port), "5")
        assert proxy.accepted >= 1 and proxy.publishes == 0  # connected, blocked, never written to
    assert took < 5 + PAST_MAX_TIME, proc.stderr[-3000:]
    with runtime.sessions() as session:
        rows = list(session.scalars(select(Delivery)))
    tried = [d for d in rows if d.attempts]  # the rest wait behind the first of their key
    assert tried and all(d.status == "pending" for d in rows)
    assert all("the broker blocked the connection" in d.last_error for d in tried), [d.last_error for d in tried]
    finish(env, runtime)  # the alarm is over (the broker itself, no proxy)
    assert check_arrivals(rabbit.take(queue), recorded) == 0  # all arrived, none twice
