"""The relay's broker connection under faults, against the real RabbitMQ through a loopback proxy, on
SQLite and MariaDB: heartbeats on the kept connection, a broker that takes a batch and never
confirms it, the connection cut in the middle of a batch. Always: nothing acked that the broker did
not confirm, nothing lost, duplicates carry the same message_id."""
from __future__ import annotations

import json
import time
from datetime import datetime, timedelta

import pytest

import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.run_loop import run_loop
from cronbox.outbox.amqp.broker import Broker, Outgoing
from cronbox.outbox.events.relay import Relay
from tests.helpers import deliveries, wait_for
from tests.rabbit import rabbitmqctl, url
from tests.tcp_proxy import TcpProxy

# The broker's faults at the forward: the server behind the rows changes nothing, so not PostgreSQL too
# (.ci/run's 30 minutes; forwarding runs on it in test_forward, test_forward_blocked, test_forward_processes).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

T0 = datetime(2026, 12, 1, 9, 0, 0)
PUBLISH = b"\x00\x3c\x00\x28"  # class 60 (basic), method 40 (publish): the start of a basic.publish frame


def record(runtime, count: int, *, key=None, start: int = 0) -> list[tuple[int, str]]:
    with runtime.sessions.begin() as session:
        events = [cronbox.record(session, "e", {"n": start + n}, key=key(n) if callable(key) else key)
                  for n in range(count)]
        session.flush()
        return [(e.id, e.trace_id) for e in events]


def relay_for(runtime, amqp_url: str, **broker_args) -> Relay:
    return Relay(runtime, broker=Broker(amqp_url, **broker_args))


def run(relay: Relay, max_time: float = 30):
    relay.run(Budget(max_time=max_time, memory_mb=None))
    return relay.stats


def arrived(rabbit, queue) -> dict[str, list[dict]]:
    """message_id -> the bodies of every copy in the queue."""
    out: dict[str, list[dict]] = {}
    for message in rabbit.take(queue):
        out.setdefault(message.properties["message_id"], []).append(json.loads(message.body))
    return out


def assert_acked_only_if_arrived(runtime, copies, events) -> None:
    """Every delivery marked done has its message at the broker (nothing acked unconfirmed)."""
    ids = {event_id: f"cronbox-{event_id}-{trace}" for event_id, trace in events}
    for row in deliveries(runtime, consumer="to-broker"):
        if row.status == "done":
            assert ids[row.event_id] in copies, f"delivery {row.id} acked but its message never arrived"


def relay_connections(vhost: str) -> list[str]:
    """`timeout` (the negotiated heartbeat, seconds) of each cronbox relay connection in `vhost`."""
    rows = rabbitmqctl("list_connections", "-q", "--no-table-headers", "vhost", "timeout", "client_properties")
    return [line.split("\t")[1] for line in rows.splitlines()
            if line.split("\t")[0] == vhost and "cronbox relay" in line]


# -- heartbeats ----------------------------------------------------------------------

def test_the_kept_connection_negotiates_a_heartbeat(runtime, registry, rabbit):
    cronbox.forward("*", exchange=rabbit.exchange(), name="to-broker", registry=registry)
    rabbit.queue(rabbit.exchanges[-1])
    record(runtime, 1)
    relay = relay_for(runtime, rabbit.url)
    try:
        assert run(relay).done == 1 and relay.broker.is_open
        assert relay_connections(rabbit.vhost) == ["60"]  # the broker's view of it
    finally:
        relay.close()


def test_an_idle_lingering_relay_keeps_its_connection_alive_with_heartbeats(runtime, registry, rabbit):
    """Heartbeat 2 s: RabbitMQ closes a connection that stays silent for about two of them. A relay
    polled as the tick's linger polls it (each poll services the connection) keeps its connection
    for 8 s; one left alone loses it, notices on its next poll, and its next batch opens a new
    connection instead of failing."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    cronbox.forward("*", exchange=exchange, name="to-broker", registry=registry)
    relay = relay_for(runtime, rabbit.url, heartbeat=2)
    try:
        record(runtime, 1)
        assert run(relay).done == 1
        assert relay.broker._connection.heartbeat == 2
        run_loop([relay.run], Budget(max_time=8, memory_mb=None), linger=True, poll=0.3)
        record(runtime, 1, start=1)
        stats = run(relay)
        assert stats.done == 2 and stats.retried == 0
        assert relay.broker.connects == 1  # the same connection throughout: the broker kept it

        time.sleep(10)  # no polls, no heartbeats: the broker gives up on the connection
        run(relay)  # an idle poll: finds it closed and drops it; no batch pays for it
        assert not relay.broker.is_open
        record(runtime, 1, start=2)
        stats = run(relay)
        assert stats.done == 3 and stats.retried == 0 and relay.broker.connects == 2
    finally:
        relay.close()
    assert sorted(b["n"] for copies in arrived(rabbit, queue).values() for b in copies) == [0, 1, 2]


def test_a_connection_cut_while_idle_is_noticed_on_the_next_poll(runtime, registry, rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    cronbox.forward("*", exchange=exchange, name="to-broker", registry=registry)
    with TcpProxy(5672) as proxy:
        relay = relay_for(runtime, url(rabbit.vhost, proxy.port))
        try:
            record(runtime, 1)
            assert run(relay).done == 1
            assert proxy.cut() == 1  # a NAT dropping the idle connection, a broker restart
            run(relay)
            assert not relay.broker.is_open
            record(runtime, 1, start=1)
            stats = run(relay)
        finally:
            relay.close()
    assert stats.done == 2 and stats.retried == 0 and relay.broker.connects == 2
    assert len(arrived(rabbit, queue)) == 2


# -- a confirm that never comes ------------------------------------------------------------

def test_a_batch_the_broker_never_confirms_is_not_acked_and_retried_with_backoff(runtime, registry, rabbit):
    """The proxy passes the batch to the broker (it is routed: the queue has it) but none of the
    broker's answers back: after the target's timeout nothing is acked, every delivery waits its
    backoff, per-key order holds, and a lingering run still ends by its max time."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    cronbox.forward("*", exchange=exchange, name="to-broker", registry=registry, timeout=1, backoff=[30])
    with TcpProxy(5672) as proxy, clock.frozen(T0):
        events = record(runtime, 4, key=lambda n: f"k{n % 2}")
        proxy.mute_on(PUBLISH)
        relay = relay_for(runtime, url(rabbit.vhost, proxy.port))
        started = clock.monotonic()
        result = run_loop([relay.run], Budget(max_time=4, memory_mb=None), linger=True, poll=0.2)
        took = clock.monotonic() - started
        rows = deliveries(runtime, consumer="to-broker")
        # by its 4 s max time (a loaded machine's lateness aside), not lingering on past it
        assert result.stop_reason == "max-time" and took < 4 + 8
        assert relay.stats.done == 0 and relay.stats.retried == 2  # the first of each key; the rest held back
        first = [r for r in rows if r.attempts == 1]
        assert len(first) == 2 and all(r.status == "pending" and "no confirm from the broker within 1s"
                                       in r.last_error and r.next_attempt_at == T0 + timedelta(seconds=30)
                                       for r in first)
        assert all(r.status == "pending" and r.attempts == 0 for r in rows if r not in first)
        held = arrived(rabbit, queue)
        assert len(held) == 2  # the broker has them, unconfirmed: they will be published again

        proxy.unmute()
        clock.advance(31)
        while run(relay).done < 4:
            clock.advance(31)
        relay.close()
    copies = arrived(rabbit, queue)
    assert sorted(b["n"] for c in copies.values() for b in c) == [0, 1, 2, 3]
    assert set(held) <= {f"cronbox-{e}-{t}" for e, t in events}  # the same identity both times
    assert all(r.status == "done" for r in deliveries(runtime, consumer="to-broker"))


# -- the connection cut in the middle of a batch -----------------------------------------------

@pytest.mark.parametrize("second", ["delivers", "fails too"])
def test_an_operator_closing_the_connection_republishes_the_batch_at_once_in_the_same_attempt(rabbit, second):
    """`rabbitmqctl close_connection` on the relay's kept connection: the next batch finds it closed
    and goes again at once on a new connection, in the same attempt (the README says so: a lost
    connection is not the messages' fault). Only when that fails too (here: the broker's confirms
    held back by the proxy) is it a failed attempt, which the relay retries with backoff."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    with TcpProxy(5672, amqp=True) as proxy:
        broker = Broker(url(rabbit.vhost, proxy.port))
        assert broker.send([Outgoing(exchange, "e", b"{}", {"message_id": "m0"})], 5) == [None]
        assert rabbit.close_cronbox_connections() == 1
        # rabbitmqctl returns before the broker's connection.close reaches the client: the batch must
        # find it there (unread), not publish on the connection before it arrives; after a mute below
        # it would never arrive (what the broker sends on a muted connection is held back).
        wait_for(lambda: proxy.closes_passed == 1, "the broker's connection.close to reach the relay")
        if second == "fails too":
            proxy.mute_on(PUBLISH)
        results = broker.send([Outgoing(exchange, "e", b"{}", {"message_id": f"m{i}"}) for i in (1, 2, 3)], 2)
        broker.close()
    assert broker.connects == 2
    if second == "delivers":
        assert results == [None, None, None]
        assert [m.properties["message_id"] for m in rabbit.take(queue)] == ["m0", "m1", "m2", "m3"]
    else:
        assert all(r.startswith("no confirm from the broker within 2s") for r in results), results


@pytest.mark.parametrize("connection", ["kept", "fresh"])
def test_the_connection_cut_in_the_middle_of_a_batch_loses_nothing_and_acks_nothing_unconfirmed(
        runtime, registry, rabbit, connection):
    """The proxy cuts the connection after passing part of a batch (whole messages, then half of
    one). A lost connection is not the messages' fault: on a kept connection and on a fresh one
    alike, what the cut left unconfirmed is published once more at once on a new connection, in the
    same attempt (no backoff). What the broker confirmed before the cut is acked, nothing else is, and
    every event gets there, in per-key order."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    cronbox.forward("*", exchange=exchange, name="to-broker", registry=registry, timeout=2, backoff=[10])
    with TcpProxy(5672) as proxy, clock.frozen(T0):
        relay = relay_for(runtime, url(rabbit.vhost, proxy.port))
        events = record(runtime, 1)
        assert run(relay).done == 1
        handshake_and_one = proxy.upstream_bytes
        events += record(runtime, 1, start=1)
        assert run(relay).done == 2
        one = proxy.upstream_bytes - handshake_and_one  # a message's frames (+ a heartbeat at most)
        events += record(runtime, 40, key=lambda n: f"k{n % 5}", start=2)
        # A claim takes each key's next delivery: batches of 5. Kept: the cut falls in the third
        # batch (two confirmed and acked before it), after two and a half of its messages. Fresh:
        # in the first batch on a new connection.
        if connection == "kept":
            proxy.cut_after(int(12.5 * one))
        else:
            relay.broker.close()
            proxy.cut_after(handshake_and_one - one + int(2.5 * one))
        stats = run(relay)
        order = rabbit.take(queue)
        first = {m.properties["message_id"] for m in order}
        assert relay.broker.connects == (2 if connection == "kept" else 3)  # the cut cost one new connection
        assert_acked_only_if_arrived(runtime, first, events)
        # What the cut left unconfirmed went again at once on the new connection: no attempt failed.
        assert (stats.retried, stats.done) == (0, 42)
        assert all(r.attempts == 1 for r in deliveries(runtime, consumer="to-broker"))
        for _ in range(60):
            if all(r.status == "done" for r in deliveries(runtime, consumer="to-broker")):
                break
            clock.advance(11)
            run(relay)
        relay.close()
    order += rabbit.take(queue)
    expected = {f"cronbox-{e}-{t}": n for n, (e, t) in enumerate(events)}
    assert {m.properties["message_id"] for m in order} == set(expected)  # every event at least once
    assert all(json.loads(m.body)["n"] == expected[m.properties["message_id"]] for m in order)  # copies identical
    firsts = list(dict.fromkeys(expected[m.properties["message_id"]] for m in order))
    for key in range(5):
        ns = [n for n in firsts if n >= 2 and (n - 2) % 5 == key]
        assert ns == sorted(ns), f"key k{key} out of order: {ns}"
    assert len(order) >= len(expected)  # what the broker took unconfirmed came twice, with the same identity
    assert all(r.status == "done" for r in deliveries(runtime, consumer="to-broker"))
