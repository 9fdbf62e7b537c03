"""Forwarding to the real RabbitMQ, in-process, on SQLite and MariaDB: what arrives, what is acked,
order per key, and every way the broker can fail a batch (unroutable, exchange missing, refused,
cut, closed by the broker)."""
from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta

import pytest

import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.events import deliveries as store
from cronbox.outbox.events.relay import Relay
from tests.helpers import deliveries
from tests.rabbit import url
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "mysql-token", "postgresql")

T0 = datetime(2026, 12, 1, 9, 0, 0)


def relay_with(runtime, amqp_url: str) -> Relay:
    runtime.settings.raw["CRONBOX_AMQP_URL"] = amqp_url  # raw is this test's own dict
    return Relay(runtime)


def run(relay: Relay):
    relay.run(Budget(max_time=30, memory_mb=None))
    return relay.stats


def record(runtime, event_type, payloads, *, key=None, rollback=False):
    with runtime.sessions() as session:
        events = [cronbox.record(session, event_type, p, key=key(i) if callable(key) else key)
                  for i, p in enumerate(payloads)]
        session.flush()
        out = [(e.id, e.trace_id) for e in events]
        (session.rollback if rollback else session.commit)()
    return out


def by_status(runtime, consumer):
    return {d.event_id: d for d in deliveries(runtime, consumer=consumer)}


def test_committed_events_arrive_exactly_as_recorded_rolled_back_never(runtime, registry, rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "clinic.#")
    cronbox.forward("clinic.*", exchange=exchange, name="to-broker", registry=registry)
    payloads = [{"n": n, "text": "ünïcode ✓", "nested": {"list": [1, 2.5, None, True]}} for n in range(7)]
    committed = record(runtime, "clinic.booked", payloads, key=lambda i: f"patient:{i % 3}")
    record(runtime, "clinic.booked", [{"n": "rolled back"}], rollback=True)
    record(runtime, "other.type", [{"n": "not forwarded"}])
    relay = relay_with(runtime, rabbit.url)
    try:
        stats = run(relay)
    finally:
        relay.close()
    messages = rabbit.take(queue)
    assert stats.done == 7 and relay.broker.connects == 1
    assert [json.loads(m.body) for m in messages] == payloads  # one key per claim round: order may
    # interleave across keys, but these were claimed in one batch in id order
    for (event_id, trace_id), message, n in zip(committed, messages, range(7)):
        p = message.properties
        assert p["message_id"] == f"cronbox-{event_id}-{trace_id}"
        assert p["delivery_mode"] == 2 and p["content_type"] == "application/json" and p["type"] == "clinic.booked"
        headers = p["application_headers"]
        assert headers["x-event-key"] == f"patient:{n % 3}" and headers["x-trace-id"] == trace_id
        assert headers["x-event-id"] == event_id and headers["x-created-at"].endswith("+00:00")
    assert all(d.status == "done" for d in deliveries(runtime, consumer="to-broker"))
    assert not relay.broker.is_open  # closed at the end of the run


def test_unroutable_is_a_visible_failure_and_holds_its_key_while_other_keys_flow(runtime, registry, rabbit):
    exchange = rabbit.exchange()
    good = rabbit.queue(exchange, "ok.#", what="good")
    cronbox.forward("*", exchange=exchange, name="to-broker", registry=registry, backoff=[10])
    with clock.frozen(T0):
        blocked = record(runtime, "nobody.listens", [{"i": i} for i in range(3)], key="blocked")
        flowing = record(runtime, "ok.flows", [{"i": i} for i in range(3)], key="flowing")
        relay = relay_with(runtime, rabbit.url)
        run(relay)
        rows = by_status(runtime, "to-broker")
        first_blocked = rows[blocked[0][0]]
        assert first_blocked.status == "pending" and first_blocked.attempts == 1
        assert "unroutable" in first_blocked.last_error and "nobody.listens" in first_blocked.last_error
        assert all(rows[e].attempts == 0 for e, _ in blocked[1:])  # held back behind it, never published
        assert all(rows[e].status == "done" for e, _ in flowing)
        assert [json.loads(m.body)["i"] for m in rabbit.take(good)] == [0, 1, 2]

        # Fixed by binding a queue: after the backoff the key drains, in order.
        late = rabbit.queue(exchange, "nobody.#", what="late")
        clock.advance(11)
        run(relay)
        relay.close()
    assert [json.loads(m.body)["i"] for m in rabbit.take(late)] == [0, 1, 2]
    assert all(d.status == "done" for d in deliveries(runtime, consumer="to-broker"))


def test_missing_exchange_fails_its_target_alone(runtime, registry, rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    cronbox.forward("*", exchange=exchange, name="fine", registry=registry)
    cronbox.forward("*", exchange=rabbit.name("missing"), name="misconfigured", registry=registry, backoff=[10])
    with clock.frozen(T0):
        events = record(runtime, "thing.happened", [{"i": i} for i in range(4)])
        relay = relay_with(runtime, rabbit.url)
        run(relay)
        relay.close()
    assert len(rabbit.take(queue)) == 4
    assert all(d.status == "done" for d in deliveries(runtime, consumer="fine"))
    bad = deliveries(runtime, consumer="misconfigured")
    assert len(bad) == 4 and all(d.status == "pending" and d.attempts == 1 for d in bad)
    assert all("channel closed by the broker" in d.last_error and "NOT_FOUND" in d.last_error for d in bad)
    assert len(events) == 4


def test_broker_refusing_then_back_nothing_acked_unconfirmed(runtime, registry, rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    cronbox.forward("*", exchange=exchange, name="to-broker", registry=registry, backoff=[10], max_attempts=2)
    with TcpProxy(5672) as proxy, clock.frozen(T0):
        proxy.refuse()
        record(runtime, "e", [{"i": i} for i in range(5)], key=lambda i: f"k{i}")
        relay = relay_with(runtime, url(rabbit.vhost, proxy.port))
        stats = run(relay)
        assert stats.done == 0 and stats.retried == 5
        rows = deliveries(runtime, consumer="to-broker")
        assert all(d.status == "pending" and "broker unreachable" in d.last_error for d in rows)
        assert rabbit.take(queue) == []
        proxy.accept()
        clock.advance(11)
        stats = run(relay)
        relay.close()
    assert stats.done == 5
    assert sorted(json.loads(m.body)["i"] for m in rabbit.take(queue)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("fault", ["cut", "broker-close"])
def test_a_kept_connection_that_died_is_reopened_not_counted_as_a_failure(runtime, registry, rabbit, fault):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    cronbox.forward("*", exchange=exchange, name="to-broker", registry=registry)
    with TcpProxy(5672) as proxy:
        relay = relay_with(runtime, url(rabbit.vhost, proxy.port))
        record(runtime, "e", [{"batch": 1}])
        assert run(relay).done == 1 and relay.broker.is_open
        if fault == "cut":
            assert proxy.cut() == 1
        else:
            assert rabbit.close_cronbox_connections() == 1
        record(runtime, "e", [{"batch": 2}])
        stats = run(relay)
        relay.close()
    assert stats.done == 2 and stats.retried == 0 and relay.broker.connects == 2
    assert [json.loads(m.body)["batch"] for m in rabbit.take(queue)] == [1, 2]


def test_a_broker_that_never_answers_costs_the_timeout_not_the_run(runtime, registry, rabbit):
    """A peer that accepts the TCP connection and then never answers (a black hole): the batch waits
    no longer than the target's timeout, nothing is acked, the delivery retries."""
    import socket
    import threading

    hole = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: held.append(hole.accept()), daemon=True).start()
    cronbox.forward("*", exchange=rabbit.exchange(), name="to-broker", registry=registry, timeout=1)
    record(runtime, "e", [{"i": 1}])
    relay = relay_with(runtime, url(rabbit.vhost, hole.getsockname()[1]))
    started = clock.monotonic()
    stats = run(relay)
    relay.close()
    hole.close()
    assert clock.monotonic() - started < 15  # the target's 1 s timeout, not the run's 30 s
    assert stats.done == 0 and stats.retried == 1
    (row,) = deliveries(runtime, consumer="to-broker")
    assert row.status == "pending" and "broker unreachable" in row.last_error


def test_without_a_url_forwarding_waits_visibly(runtime, registry):
    cronbox.forward("*", exchange="anything", name="to-broker", registry=registry)
    record(runtime, "e", [{"i": 1}])
    relay = Relay(runtime)
    stats = run(relay)
    (row,) = deliveries(runtime, consumer="to-broker")
    assert stats.retried == 1 and row.status == "pending" and "CRONBOX_AMQP_URL is not set" in row.last_error


def test_in_process_consumers_and_forwards_share_a_batch(runtime, registry, rabbit):
    seen = []

    @cronbox.consumer("e", name="local", runs="tick", registry=registry)
    def local(event, ctx):
        seen.append(event.payload["i"])

    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    cronbox.forward("e", exchange=exchange, name="to-broker", registry=registry)
    record(runtime, "e", [{"i": i} for i in range(3)])
    relay = relay_with(runtime, rabbit.url)
    assert run(relay).done == 6
    relay.close()
    assert seen == [0, 1, 2] and len(rabbit.take(queue)) == 3


def test_a_routing_key_function_sees_the_event_and_its_failure_is_that_deliverys(runtime, registry, rabbit):
    exchange = rabbit.exchange()
    lab = rabbit.queue(exchange, "lab.blood", what="lab")

    def route(event):
        return f"lab.{event.payload['kind']}"  # KeyError for an event without a kind

    cronbox.forward("result", exchange=exchange, routing_key=route, name="to-broker", registry=registry,
                   backoff=[10])
    with clock.frozen(T0):
        record(runtime, "result", [{"kind": "blood"}, {"no": "kind"}, {"kind": "blood"}])
        relay = relay_with(runtime, rabbit.url)
        stats = run(relay)
        relay.close()
    assert stats.done == 2 and stats.retried == 1
    assert [json.loads(m.body) for m in rabbit.take(lab)] == [{"kind": "blood"}, {"kind": "blood"}]
    (failed,) = [d for d in deliveries(runtime, consumer="to-broker") if d.status == "pending"]
    assert failed.last_error.startswith("no routing key: KeyError")


def test_a_forward_targets_deliveries_are_pending_rows_claimed_like_any_consumers(runtime, registry):
    """The fan-out writes a forward target's deliveries as it writes an in-process consumer's:
    pending, no lease; the claim takes them in id order, one per (consumer, key) at a time, not an
    event that is not due yet."""
    cronbox.forward("t.*", exchange="x", name="fwd", registry=registry, timeout=7)
    cronbox.consumer("t.a", name="local", runs="tick", registry=registry)(lambda event, ctx: None)
    with clock.frozen(T0):
        ids = [i for i, _ in record(runtime, "t.a", [{"n": n} for n in range(4)],
                                    key=lambda i: [None, "k1", "k1", None][i])]
        with runtime.sessions() as session:
            late = cronbox.record(session, "t.a", {"n": "later"}, delay=60).id
            session.commit()
        with runtime.sessions.begin() as session:
            assert store.fan_out(session, runtime.consumers, T0, 500) == (5, 10)
        assert all((d.status, d.attempts, d.claim_token) == ("pending", 0, None) for d in deliveries(runtime))
        with runtime.sessions.begin() as session:
            claimed = store.claim_due(session, runtime.consumers, now=T0, limit=100, mode=runtime.claim_mode(),
                                      lease_margin=5.0)
    fwd = [d for d in claimed if d.consumer == "fwd"]
    assert [d.event_id for d in fwd] == [ids[0], ids[1], ids[3]]  # k1's second waits behind its first
    assert all(d.attempts == 1 and d.lease_until == datetime(2026, 12, 1, 9, 0, 12) for d in fwd)
    assert late not in {d.event_id for d in claimed}


def test_a_relay_killed_after_publishing_loses_nothing_and_publishes_again_after_the_lease(runtime, registry,
                                                                                           rabbit):
    """A run that claimed and published a batch and died before its ack: the deliveries stay
    leased; once the lease runs out the next run claims them again (alone, one at a time, as any
    expired lease) and publishes them again with the same message ids: duplicates, never a loss."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    cronbox.forward("*", exchange=exchange, name="fwd", registry=registry, timeout=5)
    with clock.frozen(T0):
        committed = record(runtime, "thing.sent", [{"n": n} for n in range(3)])
        with runtime.sessions.begin() as session:  # the killed run's batch transaction
            store.fan_out(session, runtime.consumers, T0, 500)
            claimed = store.claim_due(session, runtime.consumers, now=T0, limit=100, mode=runtime.claim_mode(),
                                      lease_margin=0.0)
        assert len(claimed) == 3
        relay = relay_with(runtime, rabbit.url)
        try:
            assert run(relay).done == 0  # still leased to the killed run
            clock.advance(6)
            stats = run(relay)
        finally:
            relay.close()
    assert (stats.done, stats.lease_lost) == (3, 0)
    messages = rabbit.take(queue)
    assert sorted(m.properties["message_id"] for m in messages) == sorted(
        f"cronbox-{event_id}-{trace_id}" for event_id, trace_id in committed)
    assert [(d.status, d.attempts) for d in deliveries(runtime, consumer="fwd")] == [("done", 2)] * 3


@pytest.mark.backends("mysql-skip-locked", "mysql-token")
def test_two_relays_at_once_deliver_each_event_once(runtime, registry, settings, rabbit):
    """Two relays fanning out and claiming the same events at once (plain reads of the events,
    INSERT IGNORE of the rows, the claim's row locks): every delivery row is made once, claimed
    by one of them, and published once."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    cronbox.forward("*", exchange=exchange, name="fwd", registry=registry)
    record(runtime, "thing.raced", [{"n": n} for n in range(300)])
    runtime.settings.raw["CRONBOX_AMQP_URL"] = rabbit.url
    other = Runtime(runtime.settings, registry=registry)
    relays = [Relay(runtime, batch_size=20), Relay(other, batch_size=20)]
    errors = []

    def relay_run(relay):
        try:
            relay.run(Budget(max_time=30, memory_mb=None))
        except Exception as exc:  # reported below, with the thread's traceback lost
            errors.append(exc)

    threads = [threading.Thread(target=relay_run, args=(r,)) for r in relays]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for relay in relays:
            relay.close()
        other.dispose()
    assert not errors
    assert sorted(json.loads(m.body)["n"] for m in rabbit.take(queue)) == list(range(300))
    rows = deliveries(runtime, consumer="fwd")
    assert len(rows) == 300 and all(d.status == "done" and d.attempts == 1 for d in rows)
    assert sum(r.stats.done for r in relays) == 300


def test_a_failed_routing_key_retries_or_kills_that_delivery_alone(runtime, registry, rabbit):
    """A routing-key function failing for one event of a batch: the others are published and
    confirmed; that one retries after the backoff (attempt 1 was its), or is dead where
    max_attempts is 1."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")

    def key_of(event):
        if event.payload["n"] == 1:
            raise KeyError("no route for 1")
        return "k.ok"

    cronbox.forward("*", exchange=exchange, name="retrying", registry=registry, routing_key=key_of, backoff=[30])
    cronbox.forward("*", exchange=exchange, name="once", registry=registry, routing_key=key_of, max_attempts=1)
    with clock.frozen(T0):
        ids = [i for i, _ in record(runtime, "thing.mixed", [{"n": n} for n in range(3)])]
        relay = relay_with(runtime, rabbit.url)
        try:
            stats = run(relay)
        finally:
            relay.close()
    assert len(rabbit.take(queue)) == 4  # 2 events x 2 targets
    assert (stats.done, stats.retried, stats.gave_up) == (4, 1, 1)
    retrying, once = by_status(runtime, "retrying"), by_status(runtime, "once")
    assert {e: retrying[e].status for e in ids} == {ids[0]: "done", ids[1]: "pending", ids[2]: "done"}
    failed = retrying[ids[1]]
    assert (failed.attempts, failed.claim_token, failed.next_attempt_at) == (1, None, T0 + timedelta(seconds=30))
    assert failed.last_error.startswith("no routing key: KeyError")
    assert (once[ids[1]].status, once[ids[1]].attempts, once[ids[1]].finished_at) == ("dead", 1, T0)


def test_a_batch_of_a_retry_and_fresh_events_is_acked_whole(runtime, registry, rabbit):
    """One batch can hold a claimed retry and fresh deliveries: the broker confirms them all, and
    every one is acked."""
    exchange = rabbit.exchange()
    cronbox.forward("*", exchange=exchange, name="to-broker", registry=registry, backoff=[10])
    with clock.frozen(T0):
        (retried, _), = record(runtime, "late.bound", [{"i": 0}])
        relay = relay_with(runtime, rabbit.url)
        try:
            run(relay)  # nothing bound yet: unroutable, retried in 10 s
            assert by_status(runtime, "to-broker")[retried].status == "pending"
            queue = rabbit.queue(exchange, "#")
            clock.advance(11)
            fresh = [e for e, _ in record(runtime, "late.bound", [{"i": i} for i in range(1, 4)])]
            stats = run(relay)  # one batch: the retry and the three fresh ones
        finally:
            relay.close()
    assert sorted(json.loads(m.body)["i"] for m in rabbit.take(queue)) == [0, 1, 2, 3]
    assert (stats.done, stats.lease_lost) == (4, 0)
    rows = by_status(runtime, "to-broker")
    assert {e: (rows[e].status, rows[e].claim_token) for e in [retried, *fresh]} == {
        e: ("done", None) for e in [retried, *fresh]}


def run_until_it_raises(runtime, relay, consumers) -> dict[str, list[tuple[str, int, bool]]]:
    """Run `relay` into the RuntimeError the test arranged, close it, and give each consumer's deliveries
    as (status, attempts, still leased)."""
    try:
        with pytest.raises(RuntimeError):
            relay.run(Budget(max_time=30, memory_mb=None))
    finally:
        relay.close()
    return {name: [(d.status, d.attempts, d.claim_token is not None) for d in deliveries(runtime, consumer=name)]
            for name in consumers}


def test_an_error_between_two_targets_gives_back_the_unpublished_targets_deliveries(runtime, registry, rabbit,
                                                                                     monkeypatch):
    """A failure after target a's batch (its ack fails: the database gone for a moment) ends the run;
    target b was never published, so its deliveries are given back at once (attempt refunded, key
    free), as the in-process consumer's are, not left leased until the lease runs out. a's were
    confirmed but not acked: they stay leased and are published again after it (at least once)."""
    exchange = rabbit.exchange()
    rabbit.queue(exchange, "#")
    cronbox.forward("e", exchange=exchange, name="a", registry=registry)
    cronbox.forward("e", exchange=exchange, name="b", registry=registry)

    @cronbox.consumer("e", name="local", runs="tick", registry=registry)
    def local(event, ctx):
        pass

    record(runtime, "e", [{"i": i} for i in range(3)], key=lambda i: f"k{i}")
    relay = relay_with(runtime, rabbit.url)

    def ack_fails(items, **_how):
        raise RuntimeError("ack failed")

    monkeypatch.setattr(relay.outcomes, "ack_now", ack_fails)
    state = run_until_it_raises(runtime, relay, ("a", "b", "local"))
    assert state["local"] == [("pending", 0, False)] * 3
    assert state["b"] == [("pending", 0, False)] * 3
    assert state["a"] == [("pending", 1, True)] * 3


def test_an_error_while_a_target_fails_gives_back_the_later_targets_deliveries(runtime, registry, rabbit,
                                                                               monkeypatch):
    """The same class, from inside a target's publish: its broker failure cannot be written (the
    database gone for a moment), the run ends; the next target, never published, is given back at
    once; the failing target's own deliveries stay leased (their retry comes after the lease)."""
    exchange = rabbit.exchange()
    rabbit.queue(exchange, "#")
    cronbox.forward("e", exchange=rabbit.name("missing"), name="a", registry=registry)
    cronbox.forward("e", exchange=exchange, name="b", registry=registry)
    record(runtime, "e", [{"i": i} for i in range(3)], key=lambda i: f"k{i}")
    relay = relay_with(runtime, rabbit.url)

    def failure_not_written(item, handler, outcome):
        raise RuntimeError("database gone")

    monkeypatch.setattr(relay.outcomes, "failed", failure_not_written)
    state = run_until_it_raises(runtime, relay, ("a", "b"))
    assert state["b"] == [("pending", 0, False)] * 3
    assert state["a"] == [("pending", 1, True)] * 3
