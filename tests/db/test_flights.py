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
from outbox.events.forward import is_forward
from outbox.events.models import Delivery, Flight, OutboxEvent
from outbox.events.relay import Relay
from tests.helpers import deliveries
from tests.registries import copy_of

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

T0 = datetime(2026, 12, 1, 9, 0, 0)


def record(runtime, event_type: str, count: int, *, key=None) -> list[int]:
    """Events recorded at T0 (due from then on)."""
    with clock.frozen(T0), runtime.sessions.begin() as session:
        events = [outbox.record(session, event_type, {"n": n}, key=key) for n in range(count)]
        session.flush()
        return [e.id for e in events]


def fan_out_leased(runtime, now: datetime, limit: int = 100, **lease):
    targets = [c for c in runtime.consumers.all() if is_forward(c)]
    with runtime.sessions.begin() as session:
        lease = store.Lease.new(targets, now, 0.0, limit, **lease)
        return lease, store.fan_out(session, runtime.consumers, now, 500, lease=lease)[2]


def flights(runtime) -> list[Flight]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Flight)))


def rows(runtime, consumer: str) -> dict[int, object]:
    return {d.event_id: d for d in deliveries(runtime, consumer=consumer)}


def forward_run(runtime, amqp_url: str) -> tuple[Relay, list[str]]:
    """One relay run forwarding to `amqp_url`: the relay (its stats) and the statements it sent."""
    runtime.settings.raw["CRONBOX_AMQP_URL"] = amqp_url  # raw is this test's own dict
    relay, statements = Relay(runtime, batch_size=500), []

    def sent(connection, cursor, statement, *args):
        statements.append(" ".join(statement.split()))

    event.listen(runtime.engine, "before_cursor_execute", sent)
    try:
        relay.run(Budget(max_time=30, memory_mb=None))
    finally:
        event.remove(runtime.engine, "before_cursor_execute", sent)
        relay.close()
    return relay, statements


def test_a_confirmed_flight_writes_each_row_once_done_and_never_updates_a_delivery(runtime, registry, rabbit):
    """The point of flights: a keyless forwarded delivery costs one row write (INSERT, done), not an
    INSERT of a leased row and an UPDATE of it to done."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    outbox.forward("*", exchange=exchange, name="fwd", registry=registry)
    ids = record(runtime, "thing.done", 30)
    relay, statements = forward_run(runtime, rabbit.url)
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


def test_a_lost_flight_is_counted_as_lease_lost_by_the_relay(runtime, registry, rabbit, monkeypatch):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    outbox.forward("*", exchange=exchange, name="fwd", registry=registry)
    record(runtime, "thing.lost", 4)
    original = store.land_flight

    def grounded_meanwhile(session, token, consumer, landing, now):
        with session.begin_nested():
            assert store.flights.take(session, token, consumer)  # as a claim grounding it would
        return original(session, token, consumer, landing, now)

    monkeypatch.setattr(store, "land_flight", grounded_meanwhile)
    relay, _statements = forward_run(runtime, rabbit.url)
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
        relay, _statements = forward_run(runtime, rabbit.url)
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


def test_deliveries_in_flight_count_as_pending_due_once_expired_and_their_events_are_never_pruned(runtime, registry):
    outbox.forward("*", exchange="x", name="fwd", registry=registry, timeout=5)
    record(runtime, "thing.pending", 5)
    _lease, leased = fan_out_leased(runtime, T0)
    assert len(leased) == 5
    with runtime.sessions() as session:
        in_flight = store.status(session, T0)
        expired = store.status(session, T0 + timedelta(seconds=6))
    assert (in_flight["fwd"].pending, in_flight["fwd"].due, in_flight["fwd"].oldest_due_at) == (5, 0, None)
    assert (expired["fwd"].pending, expired["fwd"].due, expired["fwd"].oldest_due_at) == (
        5, 5, T0 + timedelta(seconds=5))  # waiting for a claim to ground it: health sees it
    with clock.frozen(T0 + timedelta(seconds=1)), runtime.sessions.begin() as session:
        assert store.prune(session, T0 + timedelta(days=30), 100) == 0  # no row yet: only the flight holds them
    assert len(flights(runtime)) == 1
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(OutboxEvent)) == 5


def test_prune_grounds_an_expired_flight_of_a_target_no_process_registers_any_more(runtime, registry):
    """A relay killed with a flight out, and the target then removed from the code: no claim grounds
    it (claims ground their own targets' flights), so the daily prune does; its rows then wait as
    any unregistered consumer's do, and keep their events."""
    outbox.forward("*", exchange="x", name="gone", registry=registry, timeout=5)
    ids = record(runtime, "thing.orphaned", 3)
    lease, _leased = fan_out_leased(runtime, T0)
    deployed = copy_of(registry, leaving_out={"gone"})  # the target removed from the code
    with clock.frozen(T0 + timedelta(seconds=6)), runtime.sessions.begin() as session:
        assert store.prune(session, T0 + timedelta(days=30), 100) == 0
    assert not flights(runtime)
    orphaned = rows(runtime, "gone")
    assert sorted(orphaned) == ids and all(d.claim_token == lease.token and d.attempts == 1 for d in orphaned.values())
    with runtime.sessions() as session:
        assert store.unregistered_due(session, deployed.consumers, T0 + timedelta(seconds=6)) == [("gone", 3)]


@pytest.mark.backends("mysql-skip-locked", "mysql-token")
@pytest.mark.parametrize("second_leases", [True, False], ids=["second-with-flights", "second-rows-only"])
def test_two_relays_fanning_out_the_same_events_never_both_publish_them(runtime, registry, settings, second_leases):
    """Two fan-outs read the same events not yet fanned out (plain reads). The second's UPDATE of
    the events waits for the first's COMMIT and then matches none of them: it raises FanOutRace
    (rolled back) whether it would fly them or insert rows, since rows of events the first put in a
    flight would be published again; the first's flight alone publishes them."""
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
                lease = store.Lease.new(targets, T0, 0.0, 10) if second_leases else None
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
    assert rows(runtime, "fwd") == {}  # the second's rows rolled back with it


def test_a_relay_whose_fan_out_lost_a_race_fans_out_again(runtime, registry, rabbit, monkeypatch):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    outbox.forward("*", exchange=exchange, name="fwd", registry=registry)
    record(runtime, "thing.raced", 6)
    original, raced = store.fan_out, []

    def lose_once(session, *args, **kwargs):
        if not raced:
            raced.append(True)
            original(session, *args, **kwargs)  # its writes are rolled back with the race
            raise store.FanOutRace("6 of 6 events fanned out by another relay meanwhile")
        return original(session, *args, **kwargs)

    monkeypatch.setattr(store, "fan_out", lose_once)
    relay, _statements = forward_run(runtime, rabbit.url)
    assert raced and relay.stats.done == 6
    assert sorted(json.loads(m.body)["n"] for m in rabbit.take(queue)) == list(range(6))
    assert len(flights(runtime)) == 0 and len(rows(runtime, "fwd")) == 6


def test_grounding_leaves_a_flight_its_owner_extended_after_the_read(runtime, registry, monkeypatch):
    """The claim reads the expired flights, then takes each: one whose owner extended its lease in
    between (and publishes on) is not grounded, its deliveries not written as expired leases."""
    outbox.forward("*", exchange="x", name="fwd", registry=registry, timeout=5)
    record(runtime, "thing.extended", 2)
    lease, leased = fan_out_leased(runtime, T0)
    later = T0 + timedelta(seconds=6)
    with runtime.sessions() as session:
        stale = store.flights.expired(session, ["fwd"], later, 10)  # read while it was expired
    assert [s[0] for s in stale] == [lease.token]
    with runtime.sessions.begin() as session:  # its owner extends it
        assert store.flights.extend(session, lease.token, "fwd", later + timedelta(seconds=30))
    monkeypatch.setattr(store.flights, "expired", lambda *args: stale)
    with runtime.sessions.begin() as session:
        assert store.ground_expired_flights(session, ["fwd"], later) == 0
    assert rows(runtime, "fwd") == {} and len(flights(runtime)) == 1


def test_releasing_a_fan_out_s_keyed_rows_and_its_flight_together(runtime, registry):
    """One fan-out leases keyed rows and a flight under one claim token; released together (a run
    that stopped between targets), each is given back its own way: the rows unleased, the flight
    written as pending rows, no attempt counted for either."""
    outbox.forward("*", exchange="x", name="fwd", registry=registry)
    keyed = record(runtime, "thing.keyed", 2, key="k")[:1] + record(runtime, "thing.other-key", 1, key="j")
    keyless = record(runtime, "thing.keyless", 2)
    lease, leased = fan_out_leased(runtime, T0)
    assert sorted((d.event_id, d.flight) for d in leased) == sorted(
        [(e, False) for e in keyed] + [(e, True) for e in keyless])
    Relay(runtime)._release(leased)
    released = rows(runtime, "fwd")
    assert all((released[e].claim_token, released[e].attempts, released[e].status) == (None, 0, "pending")
               for e in keyed + keyless)
    assert not flights(runtime)


def test_a_flight_s_short_lease_is_extended_once_and_a_lost_one_is_not_published(runtime, registry, rabbit,
                                                                                  monkeypatch):
    """With no lease margin a fresh flight's lease ends before a publish started now could finish:
    the relay extends it, one UPDATE of its row for all its deliveries. A flight whose row is gone
    by then (grounded by another run) is not published at all, each of its deliveries lease-lost."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    outbox.forward("*", exchange=exchange, name="fwd", registry=registry, timeout=5)
    record(runtime, "thing.extended", 20)
    relay, statements = forward_run(runtime, rabbit.url)
    assert relay.stats.done == 20 and len(rabbit.take(queue)) == 20
    assert len([s for s in statements if s.startswith("UPDATE cronbox_flights")]) == 1

    record(runtime, "thing.lost", 7)
    monkeypatch.setattr(store.flights, "extend", lambda session, token, consumer, lease_until: False)
    relay, _statements = forward_run(runtime, rabbit.url)
    assert rabbit.take(queue) == []
    assert (relay.stats.done, relay.stats.lease_lost) == (0, 7)


def test_a_stream_of_fresh_events_skips_empty_claims_and_the_run_still_ends_on_one(runtime, registry, rabbit,
                                                                                  monkeypatch):
    """While fresh events keep the relay busy, a claim that found nothing is not repeated every
    batch; work that became due meanwhile without a fan-out seeing it (here: a delivery made due
    as an operator's retry would, during the second fan-out) is still claimed before the run ends."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "fwd.#")
    outbox.forward("fwd.*", exchange=exchange, name="fwd", registry=registry)
    ran = []
    outbox.consumer("late.work", name="local", registry=registry)(lambda event, ctx: ran.append(event.id))
    record(runtime, "fwd.streamed", 1500)
    original, fan_outs, late = store.fan_out, [], []

    def retried_meanwhile(session, *args, **kwargs):
        fan_outs.append(1)
        if len(fan_outs) == 2:
            event_row = outbox.record(session, "late.work", {"n": "late"})
            session.flush()
            session.execute(OutboxEvent.__table__.update().where(OutboxEvent.id == event_row.id)
                            .values(fanned_out_at=clock.utcnow()))
            session.add(Delivery(event_id=event_row.id, consumer="local", key=None, status="pending", attempts=0,
                                 next_attempt_at=clock.utcnow(), created_at=clock.utcnow()))
            late.append(event_row.id)
        return original(session, *args, **kwargs)

    monkeypatch.setattr(store, "fan_out", retried_meanwhile)
    relay, statements = forward_run(runtime, rabbit.url)
    assert len(rabbit.take(queue)) == 1500 and ran == late
    claims = [s for s in statements if s.startswith("SELECT cronbox_flights.token")]  # one a claim
    assert len(fan_outs) >= 4 and len(claims) < len(fan_outs)
