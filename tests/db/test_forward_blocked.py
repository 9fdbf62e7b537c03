"""connection.blocked: RabbitMQ under a memory or disk alarm tells its publishers so, and stops
reading from them. The publisher must not write into a blocked connection: a batch waits (servicing
the connection) until the broker unblocks it, or fails what it did not send by the batch's time
limit, with the reason. The alarm is played by a proxy that sends the client connection.blocked /
connection.unblocked frames (never a real alarm: the RabbitMQ on this machine is shared) and counts
the basic.publish frames the client sends while it is blocked."""
from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.amqp.broker import Broker, Outgoing
from cronbox.outbox.events.forward import message_of
from cronbox.outbox.events.relay import Relay
from tests.helpers import deliveries
from tests.rabbit import url
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

T0 = datetime(2026, 12, 1, 9, 0, 0)


def messages(exchange: str, start: int, count: int) -> list[Outgoing]:
    return [Outgoing(exchange, "e", json.dumps({"n": n}).encode(), {"message_id": f"m{n}", "delivery_mode": 2})
            for n in range(start, start + count)]


def ids(rabbit, queue) -> list[str]:
    return [m.properties["message_id"] for m in rabbit.take(queue)]


def test_a_blocked_connection_is_waited_out_and_every_message_confirmed_once(rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    with TcpProxy(5672, amqp=True) as proxy:
        broker = Broker(url(rabbit.vhost, proxy.port))
        try:
            assert broker.send(messages(exchange, 0, 1), 5) == [None]  # the connection is open, idle
            assert proxy.block() == 1
            at_unblock = []
            timer = threading.Timer(1.0, lambda: (at_unblock.append(proxy.publishes), proxy.unblock()))
            started = time.monotonic()  # (before the timer: it unblocks 1 s after this at the soonest)
            timer.start()
            results = broker.send(messages(exchange, 1, 50), 60)  # 60: the unblock comes well within it
            took = time.monotonic() - started
            timer.join()
        finally:
            broker.close()
    assert results == [None] * 50
    assert took >= 0.9  # it waited for the unblock
    assert at_unblock == [1] and proxy.publishes_while_blocked == 0  # nothing written while blocked
    assert ids(rabbit, queue) == [f"m{n}" for n in range(51)]  # each exactly once, in order
    assert broker.connects == 1  # waited on the same connection


def test_a_connection_still_blocked_at_the_time_limit_fails_what_it_did_not_send(rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    with TcpProxy(5672, amqp=True) as proxy:
        broker = Broker(url(rabbit.vhost, proxy.port))
        try:
            assert broker.send(messages(exchange, 0, 1), 5) == [None]
            proxy.block()  # and never unblock
            started = time.monotonic()
            results = broker.send(messages(exchange, 1, 5), 5)
            took = time.monotonic() - started
            assert not broker.is_open  # dropped: the next batch opens a new connection
            assert proxy.publishes == 1 and proxy.publishes_while_blocked == 0
            assert ids(rabbit, queue) == ["m0"]
            again = broker.send(messages(exchange, 1, 5), 5)  # a new connection, not blocked
        finally:
            broker.close()
    # By its time limit: not before it, and not a second wait of it (per message, or after the limit)
    # however late a loaded machine wakes it.
    assert 4.9 <= took < 10
    assert all(r.startswith("not sent: the broker blocked the connection") and "within 5s" in r
               for r in results), results
    assert again == [None] * 5 and broker.connects == 2
    assert ids(rabbit, queue) == [f"m{n}" for n in range(1, 6)]


def test_blocked_in_the_middle_of_a_batch_it_stops_writing_and_goes_on_once_unblocked(rabbit):
    """The proxy blocks the connection once the client sent 5 messages of 3,000: the client, which
    reads what the broker sent before each publish, stops within a few messages of the frame's
    arrival, waits, and writes the rest after the unblock, every message exactly once."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    with TcpProxy(5672, amqp=True) as proxy:
        proxy.block_after(5)
        broker = Broker(url(rabbit.vhost, proxy.port))
        at_unblock = []
        timer = threading.Timer(1.0, lambda: (at_unblock.append(proxy.publishes), proxy.unblock()))
        try:
            publication = broker.publish(messages(exchange, 0, 3000), 60)  # the unblock comes well within it
            started = time.monotonic()  # (before the timer: it unblocks 1 s after this at the soonest)
            timer.start()
            results = broker.collect(publication)
            took = time.monotonic() - started
            timer.join()
        finally:
            broker.close()
    assert results == [None] * 3000
    assert at_unblock[0] < 3000 and took >= 0.5  # it stopped writing and waited
    assert ids(rabbit, queue) == [f"m{n}" for n in range(3000)]


def test_the_relay_fails_a_blocked_batch_within_the_run_and_retries_it_later(runtime, registry, rabbit):
    """A broker in alarm blocks every connection the relay opens: the run ends by its max time
    (the batch waits no longer than the run has left, not the target's 30 s), nothing is written,
    the deliveries are retried with the reason; once the alarm clears all arrive, once each."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    cronbox.forward("*", exchange=exchange, name="to-broker", registry=registry, timeout=30, backoff=[10])
    with TcpProxy(5672, amqp=True) as proxy, clock.frozen(T0):
        with runtime.sessions.begin() as session:
            for n in range(4):
                cronbox.record(session, "e", {"n": n})
        proxy.block_new = True
        relay = Relay(runtime, broker=Broker(url(rabbit.vhost, proxy.port)))
        try:
            started = time.monotonic()
            relay.run(Budget(max_time=3, memory_mb=None))
            took = time.monotonic() - started
            rows = deliveries(runtime, consumer="to-broker")
            assert took < 15 and proxy.publishes == 0  # by the run's 3 s, not the target's 30 s
            assert len(rows) == 4 and all(r.status == "pending" and "the broker blocked the connection" in r.last_error
                                          for r in rows), [r.last_error for r in rows]
            proxy.block_new = False
            clock.advance(11)
            relay.run(Budget(max_time=30, memory_mb=None))
        finally:
            relay.close()
    assert all(r.status == "done" for r in deliveries(runtime, consumer="to-broker"))
    assert sorted(json.loads(m.body)["n"] for m in rabbit.take(queue)) == [0, 1, 2, 3]


def test_a_consumer_receives_every_property_of_a_forwarded_event(rabbit):
    """What message_of publishes is what a consumer reads: body and every property, with and
    without a key, for event ids on both sides of 2**31 (AMQP's 32- and 64-bit integers)."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    created = datetime(2026, 12, 1, 9, 30, 15, 123456)
    items = [SimpleNamespace(event_id=event_id, event_type="appointment.päid", key=key, payload='{"n": "ü"}',
                             trace_id="0123456789abcdef", created_at=created)  # a claimed delivery's fields
             for event_id, key in ((7, "patient:ünï"), (2_147_483_648, None), (10**15, "k"))]
    broker = Broker(rabbit.url)
    try:
        assert broker.send([message_of(exchange, "appointment.paid", item) for item in items], 5) == [None] * 3
    finally:
        broker.close()
    got = rabbit.take(queue)
    assert [m.body for m in got] == ['{"n": "ü"}'] * 3  # decoded as its content_encoding says
    for item, message in zip(items, got):
        headers = {"x-event-type": "appointment.päid", "x-event-id": item.event_id, "x-trace-id": "0123456789abcdef",
                   "x-created-at": "2026-12-01T09:30:15.123456+00:00"}
        if item.key is not None:
            headers["x-event-key"] = item.key
        assert message.properties == {
            "content_type": "application/json", "content_encoding": "utf-8", "application_headers": headers,
            "delivery_mode": 2, "correlation_id": "0123456789abcdef",
            "message_id": f"cronbox-{item.event_id}-0123456789abcdef", "timestamp": int(created.replace(tzinfo=timezone.utc).timestamp()),
            "type": "appointment.päid", "app_id": "cronbox"}


def test_a_message_py_amqp_cannot_encode_fails_alone(rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    batch = messages(exchange, 0, 3)
    batch[1] = Outgoing(exchange, "e", b"{}", {"message_id": "m1", "type": "t" * 256})  # over a short string
    broker = Broker(rabbit.url)
    try:
        results = broker.send(batch, 5)
    finally:
        broker.close()
    assert results[0] is None and results[2] is None
    assert results[1].startswith("the message cannot be encoded for AMQP")
    assert ids(rabbit, queue) == ["m0", "m2"] and broker.connects == 1
