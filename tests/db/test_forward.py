"""Forwarding to the real RabbitMQ, in-process, on SQLite and MariaDB: what arrives, what is acked,
order per key, and every way the broker can fail a batch (unroutable, exchange missing, refused,
cut, closed by the broker)."""
from __future__ import annotations

import json
from datetime import datetime

import pytest
from sqlalchemy import select

import outbox
from outbox.core import clock
from outbox.engine.budget import Budget
from outbox.events import deliveries as store
from outbox.events.models import Delivery, Flight
from outbox.events.relay import Relay
from tests.helpers import deliveries
from tests.rabbit import url
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

T0 = datetime(2026, 12, 1, 9, 0, 0)


def relay_with(runtime, amqp_url: str) -> Relay:
    runtime.settings.raw["CRONBOX_AMQP_URL"] = amqp_url  # raw is this test's own dict
    return Relay(runtime)


def run(relay: Relay):
    relay.run(Budget(max_time=30, memory_mb=None))
    return relay.stats


def record(runtime, event_type, payloads, *, key=None, rollback=False):
    with runtime.sessions() as session:
        events = [outbox.record(session, event_type, p, key=key(i) if callable(key) else key)
                  for i, p in enumerate(payloads)]
        session.flush()
        out = [(e.id, e.trace_id) for e in events]
        (session.rollback if rollback else session.commit)()
    return out


def by_status(runtime, consumer):
    return {d.event_id: d for d in deliveries(runtime, consumer=consumer)}


def flight_rows(runtime) -> list[Flight]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Flight).order_by(Flight.created_at)))


def test_committed_events_arrive_exactly_as_recorded_rolled_back_never(runtime, registry, rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "clinic.#")
    outbox.forward("clinic.*", exchange=exchange, name="to-broker", registry=registry)
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
    outbox.forward("*", exchange=exchange, name="to-broker", registry=registry, backoff=[10])
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
    outbox.forward("*", exchange=exchange, name="fine", registry=registry)
    outbox.forward("*", exchange=rabbit.name("missing"), name="misconfigured", registry=registry, backoff=[10])
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
    outbox.forward("*", exchange=exchange, name="to-broker", registry=registry, backoff=[10], max_attempts=2)
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
    outbox.forward("*", exchange=exchange, name="to-broker", registry=registry)
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
    outbox.forward("*", exchange=rabbit.exchange(), name="to-broker", registry=registry, timeout=1)
    record(runtime, "e", [{"i": 1}])
    relay = relay_with(runtime, url(rabbit.vhost, hole.getsockname()[1]))
    started = clock.monotonic()
    stats = run(relay)
    relay.close()
    hole.close()
    assert clock.monotonic() - started < 5
    assert stats.done == 0 and stats.retried == 1
    (row,) = deliveries(runtime, consumer="to-broker")
    assert row.status == "pending" and "broker unreachable" in row.last_error


def test_without_a_url_forwarding_waits_visibly(runtime, registry):
    outbox.forward("*", exchange="anything", name="to-broker", registry=registry)
    record(runtime, "e", [{"i": 1}])
    relay = Relay(runtime)
    stats = run(relay)
    (row,) = deliveries(runtime, consumer="to-broker")
    assert stats.retried == 1 and row.status == "pending" and "CRONBOX_AMQP_URL is not set" in row.last_error


def test_in_process_consumers_and_forwards_share_a_batch(runtime, registry, rabbit):
    seen = []

    @outbox.consumer("e", name="local", runs="tick", registry=registry)
    def local(event, ctx):
        seen.append(event.payload["i"])

    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange)
    outbox.forward("e", exchange=exchange, name="to-broker", registry=registry)
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

    outbox.forward("result", exchange=exchange, routing_key=route, name="to-broker", registry=registry,
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


def test_the_fan_out_leases_a_forward_targets_new_deliveries_only_where_a_claim_would_take_them(runtime, registry):
    """deliveries.fan_out with a lease (the relay's step, so a fresh forwarded event needs no claim):
    attempt 1, the token, the target's lease; never past the limit, for an event not due yet, for a
    key held by a pending delivery (in the table or earlier in the batch), nor for an in-process
    consumer. Keyed ones are inserted leased; keyless ones have no row, only their flight's. A
    claim does not take the leased ones, and takes the rest in order."""
    outbox.forward("t.*", exchange="x", name="fwd", registry=registry, timeout=7)
    outbox.consumer("t.a", name="local", runs="tick", registry=registry)(lambda event, ctx: None)
    with clock.frozen(T0):
        [(held, _)] = record(runtime, "t.a", [{"n": "held"}], key="k-held")
        with runtime.sessions.begin() as session:
            assert store.fan_out(session, runtime.consumers, T0, 500)[:2] == (1, 2)  # pending: holds k-held
        ids = [i for i, _ in record(runtime, "t.a", [{"n": n} for n in range(6)],
                                    key=lambda i: [None, "k-held", "k1", "k1", None, None][i])]
        with runtime.sessions() as session:
            late = outbox.record(session, "t.a", {"n": "later"}, delay=60).id
            session.commit()
        targets = [c for c in runtime.consumers.all() if c.name == "fwd"]
        with runtime.sessions.begin() as session:
            lease = store.Lease.new(targets, T0, 5.0, 3)
            events, rows, leased = store.fan_out(session, runtime.consumers, T0, 500, lease=lease)
        assert (events, rows) == (7, 14)
        # keyless 0, k1's first (2), keyless 4; k-held's waits, k1's second (3) waits behind 2, 5 is past the limit
        assert [d.event_id for d in leased] == [ids[0], ids[2], ids[4]]
        assert all(d.consumer == "fwd" and d.attempts == 1 and d.claim_token == lease.token
                   and d.lease_until == datetime(2026, 12, 1, 9, 0, 12) for d in leased)
        assert json.loads(leased[0].payload) == {"n": 0} and leased[0].key is None
        assert [(d.flight, d.id is None) for d in leased] == [(True, True), (False, False), (True, True)]
        rows = by_status(runtime, "fwd")
        assert ids[0] not in rows and ids[4] not in rows  # keyless: in the flight, no row yet
        assert rows[ids[2]].id == leased[1].id and rows[ids[2]].claim_token == lease.token
        [flight] = flight_rows(runtime)
        assert (flight.token, flight.consumer, flight.event_ids, flight.size) == (
            lease.token, "fwd", f"{ids[0]},{ids[4]}", 2)
        assert flight.lease_until == datetime(2026, 12, 1, 9, 0, 12)
        assert rows[late].claim_token is None and rows[ids[1]].claim_token is None
        assert all(d.claim_token is None for d in deliveries(runtime, consumer="local"))
        with runtime.sessions.begin() as session:
            claimed = store.claim_due(session, runtime.consumers, now=T0, limit=100, mode=runtime.claim_mode(),
                                      lease_margin=5.0)
    fwd = [d.event_id for d in claimed if d.consumer == "fwd"]
    assert fwd == [held, ids[5]]  # not the leased ones, nor those their keys hold back, nor the late one


@pytest.mark.parametrize("returning", [True, False], ids=["insert-returning", "read-back"])
def test_a_leased_delivery_another_relay_inserted_first_is_not_taken_as_ours(runtime, registry, monkeypatch,
                                                                              returning):
    """The leased rows' ids come from INSERT ... RETURNING where the server has it (MariaDB >= 10.5,
    SQLite >= 3.35), else from a read back by claim token (MySQL; forced here): either way a row
    another relay's fan-out inserted first (INSERT IGNORE skips ours) is not ours to publish.
    (Keyed events: keyless ones are leased in a flight, not as rows.)"""
    if not returning:
        monkeypatch.setattr(store, "supports_insert_returning", lambda session: False)
    outbox.forward("t.*", exchange="x", name="fwd", registry=registry, timeout=7)
    outbox.consumer("t.a", name="local", runs="tick", registry=registry)(lambda event, ctx: None)
    with clock.frozen(T0):
        ids = [i for i, _ in record(runtime, "t.a", [{"n": n} for n in range(4)], key=lambda i: f"k{i}")]
        with runtime.sessions.begin() as session:  # the other relay's row for event 1, not yet fanned out here
            session.add(Delivery(event_id=ids[1], consumer="fwd", key=None, status="pending", attempts=1,
                                 next_attempt_at=T0, claim_token="theirs", lease_until=T0, created_at=T0))
        targets = [c for c in runtime.consumers.all() if c.name == "fwd"]
        with runtime.sessions.begin() as session:
            lease = store.Lease.new(targets, T0, 5.0, 10)
            events, _rows, leased = store.fan_out(session, runtime.consumers, T0, 500, lease=lease)
    assert events == 4 and not flight_rows(runtime)
    assert [(d.event_id, d.consumer, d.attempts, d.claim_token) for d in leased] == [
        (e, "fwd", 1, lease.token) for e in (ids[0], ids[2], ids[3])]
    rows = by_status(runtime, "fwd")
    assert [d.id for d in leased] == [rows[e].id for e in (ids[0], ids[2], ids[3])]
    assert rows[ids[1]].claim_token == "theirs"
    assert all(rows[e].lease_until == datetime(2026, 12, 1, 9, 0, 12) and rows[e].next_attempt_at == T0
               and rows[e].created_at == T0 for e in (ids[0], ids[2], ids[3]))
    assert len(deliveries(runtime, consumer="local")) == 4


def test_a_batch_of_a_retry_and_fresh_events_is_acked_whole(runtime, registry, rabbit):
    """One batch can hold a claimed retry and fresh deliveries the fan-out leased under another
    claim token: the broker confirms them all, and every one is acked (not only those of the first
    item's token, leaving the rest to be published again when their leases run out)."""
    exchange = rabbit.exchange()
    outbox.forward("*", exchange=exchange, name="to-broker", registry=registry, backoff=[10])
    with clock.frozen(T0):
        (retried, _), = record(runtime, "late.bound", [{"i": 0}])
        relay = relay_with(runtime, rabbit.url)
        try:
            run(relay)  # nothing bound yet: unroutable, retried in 10 s
            assert by_status(runtime, "to-broker")[retried].status == "pending"
            queue = rabbit.queue(exchange, "#")
            clock.advance(11)
            fresh = [e for e, _ in record(runtime, "late.bound", [{"i": i} for i in range(1, 4)])]
            stats = run(relay)  # one claim_and_fan_out: the retry claimed, the three leased
        finally:
            relay.close()
    assert sorted(json.loads(m.body)["i"] for m in rabbit.take(queue)) == [0, 1, 2, 3]
    assert (stats.done, stats.lease_lost) == (4, 0)
    rows = by_status(runtime, "to-broker")
    assert {e: (rows[e].status, rows[e].claim_token) for e in [retried, *fresh]} == {
        e: ("done", None) for e in [retried, *fresh]}
