"""Flights (outbox.events.flights): a forward target's fresh keyless deliveries have no row until
their outcome is known. Written once (done, retrying, dead or released), grounded into expired
leased rows when their lease runs out, counted as pending meanwhile, never lost to prune, and never
published twice by two relays fanning out the same events."""
from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta

import pytest
from sqlalchemy import event, func, select

import outbox
from outbox.core import clock
from outbox.engine.budget import Budget
from outbox.engine.runtime import Runtime
from outbox.events import deliveries as store
from outbox.events.models import Flight, OutboxEvent
from outbox.events.relay import Relay
from tests.helpers import deliveries

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

T0 = datetime(2026, 12, 1, 9, 0, 0)


def record(runtime, event_type: str, count: int, *, key=None) -> list[int]:
    """Events recorded at T0 (due from then on)."""
    with clock.frozen(T0), runtime.sessions.begin() as session:
        events = [outbox.record(session, event_type, {"n": n}, key=key) for n in range(count)]
        session.flush()
        return [e.id for e in events]


def fan_out_leased(runtime, now: datetime, limit: int = 100, **lease):
    targets = [c for c in runtime.consumers.all() if getattr(c, "target", None) is not None]
    with runtime.sessions.begin() as session:
        lease = store.Lease.new(targets, now, 0.0, limit, **lease)
        return lease, store.fan_out(session, runtime.consumers, now, 500, lease=lease)[2]


def flights(runtime) -> list[Flight]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Flight)))


def rows(runtime, consumer: str) -> dict[int, object]:
    return {d.event_id: d for d in deliveries(runtime, consumer=consumer)}


def relay_with(runtime, amqp_url: str) -> Relay:
    runtime.settings.raw["CRONBOX_AMQP_URL"] = amqp_url
    return Relay(runtime, batch_size=500)


def test_a_confirmed_flight_writes_each_row_once_done_and_never_updates_a_delivery(runtime, registry, rabbit):
    """The point of flights: a keyless forwarded delivery costs one row write (INSERT, done), not an
    INSERT of a leased row and an UPDATE of it to done."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    outbox.forward("*", exchange=exchange, name="fwd", registry=registry)
    ids = record(runtime, "thing.done", 30)
    statements = []
    event.listen(runtime.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *args: statements.append(" ".join(statement.split())))
    relay = relay_with(runtime, rabbit.url)
    try:
        relay.run(Budget(max_time=30, memory_mb=None))
    finally:
        relay.close()
    assert relay.stats.done == 30 and relay.stats.lease_lost == 0
    assert [json.loads(m.body)["n"] for m in rabbit.take(queue)] == list(range(30))
    written = rows(runtime, "fwd")
    assert sorted(written) == ids
    assert all((d.status, d.attempts, d.claim_token, d.lease_until) == ("done", 1, None, None) for d in written.values())
    assert all(d.finished_at is not None and d.last_error is None for d in written.values())
    assert not flights(runtime)
    assert not [s for s in statements if s.startswith("UPDATE cronbox_deliveries")]
    assert len([s for s in statements if s.startswith("INSERT") and "cronbox_deliveries" in s]) == 1


def test_a_flight_whose_lease_ran_out_becomes_expired_leased_rows_and_its_late_landing_writes_nothing(
        runtime, registry):
    """A relay killed (or stalled) with a flight out: the next claim grounds it into the leased rows
    it stands for (attempt 1, its token, its expired lease) and takes them one at a time like any
    expired lease (attempt 2); the first relay landing it afterwards finds it gone and writes nothing."""
    outbox.forward("*", exchange="x", name="fwd", registry=registry, timeout=5, max_attempts=3)
    ids = record(runtime, "thing.flew", 3)
    lease, leased = fan_out_leased(runtime, T0)
    assert [d.event_id for d in leased] == ids and all(d.flight for d in leased)
    assert rows(runtime, "fwd") == {}
    with runtime.sessions.begin() as session:  # still within the lease: nothing grounded, nothing due
        assert store.claim_due(session, runtime.consumers, now=T0 + timedelta(seconds=4), limit=10,
                               mode=runtime.claim_mode(), lease_margin=0.0) == []
    assert len(flights(runtime)) == 1
    later = T0 + timedelta(seconds=6)
    with runtime.sessions.begin() as session:
        claimed = store.claim_due(session, runtime.consumers, now=later, limit=10, mode=runtime.claim_mode(),
                                  lease_margin=0.0)
    assert [(d.event_id, d.attempts, d.flight) for d in claimed] == [(ids[0], 2, False)]  # alone
    grounded = rows(runtime, "fwd")
    assert sorted(grounded) == ids and not flights(runtime)
    assert all((d.status, d.attempts, d.claim_token, d.lease_until) == ("pending", 1, lease.token, T0 + timedelta(seconds=5))
               for e, d in grounded.items() if e != ids[0])
    with runtime.sessions.begin() as session:  # the first relay comes back with its confirms
        landed = store.land_flight(session, lease.token, "fwd", store.Landing(ids, [], []), later)
    assert landed is False
    after = rows(runtime, "fwd")
    assert all(d.status == "pending" for d in after.values())  # not marked done by the lost flight


def test_a_lost_flight_is_counted_as_lease_lost_by_the_relay(runtime, registry, rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    outbox.forward("*", exchange=exchange, name="fwd", registry=registry)
    record(runtime, "thing.lost", 4)
    relay = relay_with(runtime, rabbit.url)
    original = store.land_flight

    def grounded_meanwhile(session, token, consumer, landing, now):
        with session.begin_nested():
            assert store.flights.take(session, token, consumer)  # as a claim grounding it would
        return original(session, token, consumer, landing, now)

    store.land_flight = grounded_meanwhile
    try:
        relay.run(Budget(max_time=30, memory_mb=None))
    finally:
        store.land_flight = original
        relay.close()
    assert len(rabbit.take(queue)) == 4
    assert (relay.stats.done, relay.stats.lease_lost) == (0, 4)
    assert rows(runtime, "fwd") == {}


def test_a_flight_with_a_failed_delivery_lands_whole_done_retrying_and_dead(runtime, registry, rabbit):
    """A routing-key function failing for one event of a flight: the others are published and
    confirmed; the flight lands at once with them done and that one retrying after the backoff
    (attempt 1 was its), or dead where max_attempts is 1."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")

    def key_of(event):
        if event.payload["n"] == 1:
            raise KeyError("no route for 1")
        return "k.ok"

    outbox.forward("*", exchange=exchange, name="retrying", registry=registry, routing_key=key_of, backoff=[30])
    outbox.forward("*", exchange=exchange, name="once", registry=registry, routing_key=key_of, max_attempts=1)
    with clock.frozen(T0):
        ids = record(runtime, "thing.mixed", 3)
        relay = relay_with(runtime, rabbit.url)
        try:
            relay.run(Budget(max_time=30, memory_mb=None))
        finally:
            relay.close()
    assert len(rabbit.take(queue)) == 4  # 2 events x 2 targets
    assert (relay.stats.done, relay.stats.retried, relay.stats.gave_up) == (4, 1, 1)
    retrying, once = rows(runtime, "retrying"), rows(runtime, "once")
    assert {e: retrying[e].status for e in ids} == {ids[0]: "done", ids[1]: "pending", ids[2]: "done"}
    failed = retrying[ids[1]]
    assert (failed.attempts, failed.claim_token, failed.next_attempt_at) == (1, None, T0 + timedelta(seconds=30))
    assert failed.last_error.startswith("no routing key: KeyError")
    assert (once[ids[1]].status, once[ids[1]].attempts, once[ids[1]].finished_at) == ("dead", 1, T0)
    assert not flights(runtime)


def test_a_released_flight_becomes_pending_rows_its_attempt_not_counted(runtime, registry):
    outbox.forward("*", exchange="x", name="fwd", registry=registry)
    ids = record(runtime, "thing.released", 3)
    lease, leased = fan_out_leased(runtime, T0)
    relay = Relay(runtime)
    relay._release(leased)
    released = rows(runtime, "fwd")
    assert sorted(released) == ids
    assert all((d.status, d.attempts, d.claim_token) == ("pending", 0, None) for d in released.values())
    assert not flights(runtime)
    with runtime.sessions.begin() as session:
        claimed = store.claim_due(session, runtime.consumers, now=T0, limit=10, mode=runtime.claim_mode(),
                                  lease_margin=0.0)
    assert [(d.event_id, d.attempts) for d in claimed] == [(i, 1) for i in ids]


def test_deliveries_in_flight_count_as_pending_and_their_events_are_never_pruned(runtime, registry):
    outbox.forward("*", exchange="x", name="fwd", registry=registry)
    record(runtime, "thing.pending", 5)
    _lease, leased = fan_out_leased(runtime, T0)
    assert len(leased) == 5
    with runtime.sessions() as session:
        status = store.status(session, T0)
    assert (status["fwd"].pending, status["fwd"].due) == (5, 0)
    with runtime.sessions.begin() as session:  # no unfinished row: only the flight holds them
        assert store.prune(session, T0 + timedelta(days=30), 100) == 0
    assert len(flights(runtime)) == 1
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(OutboxEvent)) == 5


@pytest.mark.backends("mysql-skip-locked", "mysql-token")
def test_two_relays_fanning_out_the_same_events_never_both_fly_them(runtime, registry, settings):
    """Two fan-outs read the same events not yet fanned out (plain reads). The second's UPDATE of
    the events waits for the first's COMMIT and then matches none of them: with flights it raises
    FanOutRace (rolled back: the first's flight alone publishes them), and the relay fans out again
    without flights, as rows, which INSERT IGNORE keeps single."""
    outbox.forward("*", exchange="x", name="fwd", registry=registry)
    ids = record(runtime, "thing.raced", 4)
    other = Runtime(settings, registry=registry)
    targets = [c for c in runtime.consumers.all() if c.name == "fwd"]
    read = threading.Event()
    outcome = {}
    original_update = store.update

    def second_fan_out():
        try:
            with other.sessions.begin() as session:
                session.connection()
                lease = store.Lease.new(targets, T0, 0.0, 10)
                store.fan_out(session, other.consumers, T0, 500, lease=lease)
        except store.FanOutRace as race:
            outcome["race"] = str(race)

    try:
        with runtime.sessions.begin() as session:
            first = store.Lease.new(targets, T0, 0.0, 10)
            _e, _r, mine = store.fan_out(session, runtime.consumers, T0, 500, lease=first)
            # The second reads the same events (ours are not committed: still unfanned to it) and
            # blocks on our locked rows in its UPDATE.
            store.update = lambda table: (read.set(), original_update(table))[1]
            thread = threading.Thread(target=second_fan_out)
            thread.start()
            assert read.wait(10)
            thread.join(0.5)
            assert thread.is_alive()  # waiting on our row locks
            store.update = original_update
        thread.join(10)
    finally:
        store.update = original_update
        other.dispose()
    assert [d.event_id for d in mine] == ids
    assert "4 of 4 events fanned out by another relay meanwhile" in outcome["race"]
    [flight] = flights(runtime)
    assert flight.token == first.token


def test_a_flight_s_short_lease_is_extended_once_and_a_lost_one_is_not_published(runtime, registry, rabbit,
                                                                                  monkeypatch):
    """With no lease margin a fresh flight's lease ends before a publish started now could finish:
    the relay extends it, one UPDATE of its row for all its deliveries. A flight whose row is gone
    by then (grounded by another run) is not published at all, each of its deliveries lease-lost."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    outbox.forward("*", exchange=exchange, name="fwd", registry=registry, timeout=5)
    record(runtime, "thing.extended", 20)
    statements = []
    event.listen(runtime.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *args: statements.append(" ".join(statement.split())))
    relay = relay_with(runtime, rabbit.url)
    try:
        relay.run(Budget(max_time=30, memory_mb=None))
    finally:
        relay.close()
    assert relay.stats.done == 20 and len(rabbit.take(queue)) == 20
    assert len([s for s in statements if s.startswith("UPDATE cronbox_flights")]) == 1

    record(runtime, "thing.lost", 7)
    monkeypatch.setattr(store.flights, "extend", lambda session, token, consumer, lease_until: False)
    relay = relay_with(runtime, rabbit.url)
    try:
        relay.run(Budget(max_time=30, memory_mb=None))
    finally:
        relay.close()
    assert rabbit.take(queue) == []
    assert (relay.stats.done, relay.stats.lease_lost) == (0, 7)
