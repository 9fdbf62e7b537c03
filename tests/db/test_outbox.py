"""The outbox on every backend: record, fan-out, retries, dead, ordering, operator commands."""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select

from cronbox import outbox
import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.events.consumers import consumer
from tests.helpers import count_events, deliveries, fan_out, invoke, relay
from tests.registries import copy_of

T0 = datetime(2026, 11, 30, 12, 0, 0)

effects_meta = MetaData()
effects = Table("test_effects", effects_meta, Column("id", Integer, primary_key=True),
                Column("consumer", String(64)), Column("event_id", Integer))


@pytest.fixture
def effects_table(runtime):
    effects_meta.create_all(runtime.engine)
    return effects


def effect_counts(runtime) -> Counter:
    with runtime.sessions() as s:
        return Counter({(c, e): n for c, e, n in s.execute(
            select(effects.c.consumer, effects.c.event_id, func.count()).group_by(effects.c.consumer,
                                                                                 effects.c.event_id))})


def test_rollback_leaves_no_event_and_commit_is_delivered(runtime, registry):
    seen = []

    @consumer("note", name="seen", registry=registry)
    def on_note(event, ctx):
        seen.append((event.type, event.payload, ctx.attempt))

    with runtime.sessions() as session:
        cronbox.record(session, "note", {"n": 1})
        session.rollback()
    with runtime.sessions.begin() as session:
        cronbox.record(session, "note", {"n": 2})
    stats = relay(runtime)
    assert seen == [("note", {"n": 2}, 1)]
    assert count_events(runtime) == 1
    assert stats.done == 1
    [row] = deliveries(runtime)
    assert row.status == "done" and row.attempts == 1 and row.claim_token is None


def test_record_on_a_core_connection_commits_or_rolls_back_with_it(runtime, registry, effects_table):
    """A Core caller passes its Connection: the event is in that transaction, and only there."""
    seen = []
    consumer("note", name="seen", registry=registry)(lambda event, ctx: seen.append(event.payload))
    with runtime.engine.connect() as connection:
        with connection.begin() as tx:
            connection.execute(insert(effects).values(consumer="business", event_id=0))
            cronbox.record(connection, "note", {"n": 1})
            tx.rollback()
        with connection.begin():
            connection.execute(insert(effects).values(consumer="business", event_id=0))
            event = cronbox.record(connection, "note", {"n": 2}, key="k")
    assert event.id and event.key == "k" and len(event.trace_id) == 16
    assert count_events(runtime) == 1 and effect_counts(runtime) == Counter({("business", 0): 1})
    relay(runtime)
    assert seen == [{"n": 2}]


def test_record_never_flushes_the_callers_pending_objects(runtime):
    """record() writes on the session's connection at once (its id is known), but leaves the
    caller's pending objects pending: they flush when the caller says so, or at its commit."""
    from cronbox.outbox.events.models import OutboxEvent
    with runtime.sessions() as session:
        pending = OutboxEvent(type="by-hand", payload="{}", trace_id="t", created_at=T0, available_at=T0)
        session.add(pending)
        event = cronbox.record(session, "note", {"n": 1})
        assert pending in session.new and pending.id is None
        assert isinstance(event.id, int)
        session.rollback()
    assert count_events(runtime) == 0


def test_record_stores_times_as_sqlalchemy_would_and_its_statement_is_seen_by_the_callers_listeners(runtime):
    """record()'s INSERT is SQLAlchemy Core's on the caller's Connection: a host's statement listener
    sees it, in the caller's transaction (also on a Connection with a schema_translate_map). Its
    times are stored as SQLAlchemy stores them (on SQLite '12:00:00.000000' at a whole second, where
    the sqlite3 module's own adapter would write '12:00:00'), so the event is found by its time."""
    from sqlalchemy import event as sa_event
    from cronbox.outbox.events.models import OutboxEvent
    seen = []

    def listener(conn, cursor, statement, parameters, context, executemany):
        seen.append((statement.split("(")[0].strip(), conn.in_transaction()))

    sa_event.listen(runtime.engine, "before_cursor_execute", listener)
    try:
        with clock.frozen(T0):
            with runtime.engine.begin() as connection:
                first = cronbox.record(connection, "note", {"n": 1}, delay=timedelta(seconds=60))
            with runtime.engine.connect() as translated:
                translated.execution_options(schema_translate_map={None: None})  # in place (SQLAlchemy 2)
                with translated.begin():
                    second = cronbox.record(translated, "note", {"n": 2})
    finally:
        sa_event.remove(runtime.engine, "before_cursor_execute", listener)
    assert ("INSERT INTO cronbox_events", True) in seen
    E = OutboxEvent.__table__
    with runtime.sessions() as session:
        at_t0 = session.scalars(select(E.c.id).where(E.c.created_at == T0).order_by(E.c.id)).all()
        delayed = session.scalar(select(E.c.id).where(E.c.available_at == T0 + timedelta(seconds=60)))
    assert at_t0 == [first.id, second.id] and second.id > first.id
    assert delayed == first.id and first.available_at == T0 + timedelta(seconds=60)


def test_non_json_payload_is_refused_and_nothing_is_added(runtime):
    with runtime.sessions() as session:
        with pytest.raises(PayloadError, match=r"payload\['when'\] is a datetime"):
            cronbox.record(session, "note", {"ok": 1, "when": datetime(2026, 1, 1)})
        assert not session.new
        session.commit()
    assert count_events(runtime) == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"type": ""}, "event type"), ({"type": "x" * 192}, "event type"), ({"key": 5}, "event key"),
    ({"delay": -1}, "delay"), ({"delay": "soon"}, "delay"),
    ({"type": "a\x00b"}, "NUL"), ({"key": "k\x00"}, "NUL"),  # PostgreSQL stores no NUL in text: no backend does
    ({"type": "scan\udcff"}, "UTF-8"), ({"key": "\ud800"}, "UTF-8"),  # os.fsdecode's lone surrogates: no driver takes them
])
def test_bad_record_arguments(runtime, kwargs, message):
    args = {"type": "note", **kwargs}
    with runtime.sessions() as session:
        with pytest.raises(PayloadError, match=message):
            cronbox.record(session, args.pop("type"), {}, **args)
        assert not session.new


@pytest.mark.parametrize("payload, where", [
    ({"file": "scan\udcff.pdf"}, r"payload\['file'\]"), ({"a": [1, {"b": "\ud800"}]}, r"payload\['a'\]\[1\]\['b'\]"),
    ({"name\udce9": 1}, "has a key"), ("\udfff", "payload"),
])
def test_a_payload_with_text_that_is_not_utf8_is_refused_naming_it_and_the_transaction_goes_on(runtime, payload,
                                                                                                where):
    """A lone surrogate (os.fsdecode's stand-in for bytes that were not UTF-8) reached the driver before,
    which failed the write with an encoding error of its own; now record() refuses it first."""
    with runtime.sessions() as session:
        with pytest.raises(PayloadError, match=where + ".*UTF-8"):
            cronbox.record(session, "note", payload)
        assert not session.new
        cronbox.record(session, "note", {"file": "scan\u00ff.pdf"})  # the same text as UTF-8 is fine
        session.commit()
    assert count_events(runtime) == 1


def test_consumer_writes_commit_with_the_ack(runtime, registry, effects_table):
    @consumer("order", name="writer", registry=registry)
    def writer(event, ctx):
        ctx.session.execute(insert(effects).values(consumer="writer", event_id=event.id))

    with runtime.sessions.begin() as session:
        event = cronbox.record(session, "order", {"id": 1})
    relay(runtime)
    relay(runtime)  # nothing left: the effect is not applied again
    assert effect_counts(runtime) == Counter({("writer", event.id): 1})


def test_delay_postpones_the_first_attempt(runtime, registry):
    seen = []
    consumer("later", name="later", registry=registry)(lambda event, ctx: seen.append(event.id))
    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            cronbox.record(session, "later", {}, delay=timedelta(minutes=5))
        relay(runtime)
        assert seen == []
        clock.advance(301)
        relay(runtime)
    assert len(seen) == 1


def test_three_consumers_one_failing(runtime, registry, env, effects_table):
    """The failing consumer backs off, dies, holds its key for itself only; retry and skip repair it."""
    calls = Counter()
    broken = {"on": True}

    def make(name):
        def fn(event, ctx):
            calls[name] += 1
            ctx.session.execute(insert(effects).values(consumer=name, event_id=event.id))
        return fn

    consumer("order.placed", name="ledger", registry=registry)(make("ledger"))
    consumer("order.placed", name="mailer", registry=registry)(make("mailer"))

    @consumer("order.placed", name="sms", max_attempts=3, backoff=10, registry=registry)
    def sms(event, ctx):
        calls["sms"] += 1
        if broken["on"]:
            raise RuntimeError("gateway down")
        ctx.session.execute(insert(effects).values(consumer="sms", event_id=event.id))

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            first = cronbox.record(session, "order.placed", {"n": 1}, key="order:1")
        relay(runtime)
        assert calls == Counter(ledger=1, mailer=1, sms=1)
        [failing] = deliveries(runtime, consumer="sms")
        assert failing.status == "pending" and failing.attempts == 1
        assert failing.last_error == "RuntimeError: gateway down"
        first_wait = (failing.next_attempt_at - T0).total_seconds()
        assert 8 <= first_wait <= 12

        # A second event of the same key: the healthy consumers get it, sms holds it back.
        with runtime.sessions.begin() as session:
            second = cronbox.record(session, "order.placed", {"n": 2}, key="order:1")
        relay(runtime)
        assert calls == Counter(ledger=2, mailer=2, sms=1)

        clock.advance(first_wait + 0.01)
        relay(runtime)
        [failing, held] = deliveries(runtime, consumer="sms")
        assert failing.attempts == 2 and held.attempts == 0
        second_wait = (failing.next_attempt_at - clock.utcnow()).total_seconds()
        assert second_wait > first_wait  # backoff grows

        clock.advance(second_wait + 0.01)
        relay(runtime)
        [failing, held] = deliveries(runtime, consumer="sms")
        assert failing.status == "dead" and failing.attempts == 3 and held.status == "pending"
        assert calls == Counter(ledger=2, mailer=2, sms=3)

        # Dead holds the key, even much later; other keys still flow for sms.
        clock.advance(3600)
        with runtime.sessions.begin() as session:
            other = cronbox.record(session, "order.placed", {"n": 3}, key="order:2")
        broken["on"] = False
        relay(runtime)
        assert calls["sms"] == 4
        assert [d.status for d in deliveries(runtime, consumer="sms")] == ["dead", "pending", "done"]

        status = invoke(env, "outbox", "status")
        assert status.exit_code == 0, status.output
        sms_line = next(line for line in status.output.splitlines() if line.startswith("sms"))
        assert sms_line.split()[-5:-1] == ["1", "1", "1", "1"]  # pending, due, dead, blocked keys
        assert f"order:1  #{failing.id} (dead)  1 waiting" in status.output
        dead = invoke(env, "outbox", "dead")
        assert str(failing.id) in dead.output and "RuntimeError: gateway down" in dead.output

        retried = invoke(env, "outbox", "retry", str(failing.id))
        assert retried.exit_code == 0 and "1 deliveries pending again" in retried.output
        relay(runtime)
        assert [d.status for d in deliveries(runtime, consumer="sms")] == ["done", "done", "done"]
        assert effect_counts(runtime) == Counter(
            {(c, e.id): 1 for c in ("ledger", "mailer", "sms") for e in (first, second, other)})

        # Skip: a dead delivery given up on releases the key.
        broken["on"] = True
        with runtime.sessions.begin() as session:
            cronbox.record(session, "order.placed", {"n": 4}, key="order:3")
            cronbox.record(session, "order.placed", {"n": 5}, key="order:3")
        for _ in range(3):
            relay(runtime)
            clock.advance(3600)
        poisoned, waiting = deliveries(runtime, consumer="sms")[-2:]
        assert poisoned.status == "dead" and waiting.status == "pending" and waiting.attempts == 0
        broken["on"] = False
        skipped = invoke(env, "outbox", "skip", str(poisoned.id))
        assert skipped.exit_code == 0 and "1 deliveries skipped" in skipped.output
        relay(runtime)
        poisoned, waiting = deliveries(runtime, consumer="sms")[-2:]
        assert poisoned.status == "skipped" and waiting.status == "done"


def test_per_key_order_holds_across_retries_while_others_flow(runtime, registry):
    order: list[tuple[str | None, int]] = []
    fail_once = {2}

    @consumer("step", name="ordered", backoff=[5], registry=registry)
    def ordered(event, ctx):
        n = event.payload["n"]
        if event.key == "k" and n in fail_once:
            fail_once.discard(n)
            raise RuntimeError("transient")
        order.append((event.key, n))

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            for n in range(1, 6):
                cronbox.record(session, "step", {"n": n}, key="k")
            cronbox.record(session, "step", {"n": 1}, key="j")
            cronbox.record(session, "step", {"n": 1})
        relay(runtime)
        # k:1 delivered, k:2 failed and holds k:3..5; j and the keyless event flow.
        assert order == [("k", 1), ("j", 1), (None, 1)]
        with runtime.sessions.begin() as session:
            cronbox.record(session, "step", {"n": 2}, key="j")
            cronbox.record(session, "step", {"n": 2})
        relay(runtime)
        assert order[3:] == [("j", 2), (None, 2)]
        clock.advance(6)
        relay(runtime)
    assert [n for key, n in order if key == "k"] == [1, 2, 3, 4, 5]


def test_permanent_failure_and_retry_later(runtime, registry):
    @consumer("p", name="perm", registry=registry)
    def perm(event, ctx):
        raise cronbox.PermanentFailure("invalid address")

    attempts = []

    @consumer("p", name="later", max_attempts=2, registry=registry)
    def later(event, ctx):
        attempts.append(ctx.attempt)
        if len(attempts) < 4:
            raise cronbox.RetryLater(30, "rate limited")

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            cronbox.record(session, "p", {})
        relay(runtime)
        [dead] = deliveries(runtime, consumer="perm")
        assert dead.status == "dead" and dead.attempts == 1 and "invalid address" in dead.last_error
        for _ in range(4):
            clock.advance(31)
            relay(runtime)
    [done] = deliveries(runtime, consumer="later")
    # Three RetryLater answers used no attempt: every call was attempt 1, and it is done.
    assert attempts == [1, 1, 1, 1] and done.status == "done"


def test_unregistered_consumer_rows_wait_and_never_die(runtime, registry):
    consumer("e", name="here", registry=registry)(lambda event, ctx: None)
    consumer("e", name="gone", registry=registry)(lambda event, ctx: None)
    with runtime.sessions.begin() as session:
        cronbox.record(session, "e", {})
    fan_out(runtime)  # rows for both consumers
    deployed = Runtime(runtime.settings, registry=copy_of(registry, leaving_out={"gone"}))  # lacks the module
    try:
        relay(deployed)
    finally:
        deployed.dispose()
    by_name = {d.consumer: d for d in deliveries(runtime)}
    assert by_name["here"].status == "done"
    assert by_name["gone"].status == "pending" and by_name["gone"].attempts == 0


def test_event_for_a_type_without_consumers_is_fanned_out_and_prunable(runtime, registry, env):
    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            cronbox.record(session, "nobody.listens", {})
        relay(runtime)
        assert deliveries(runtime) == []
        clock.advance(8 * 86400)
        result = invoke(env, "outbox", "prune", "--older-than", "7d")
    assert result.exit_code == 0 and "1 events" in result.output
    assert count_events(runtime) == 0


def test_prune_keeps_unfinished_work_and_deletes_in_batches(runtime, registry, env, monkeypatch):
    from cronbox.cron.scheduling import retention

    monkeypatch.setattr(retention, "BATCH", 3)
    consumer("x", name="ok", registry=registry)(lambda event, ctx: None)

    @consumer("y", name="bad", max_attempts=1, registry=registry)
    def bad(event, ctx):
        raise RuntimeError("no")

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            for _ in range(7):
                cronbox.record(session, "x", {})
            cronbox.record(session, "y", {})  # dead: kept
        relay(runtime)
        clock.advance(3 * 86400)
        with runtime.sessions.begin() as session:
            cronbox.record(session, "x", {})  # recent: kept
        relay(runtime)
        clock.advance(5 * 86400)
        result = invoke(env, "outbox", "prune", "--older-than", "7d")
    assert result.exit_code == 0, result.output
    assert "7 events" in result.output
    assert count_events(runtime) == 2
    assert {d.consumer: d.status for d in deliveries(runtime)} == {"bad": "dead", "ok": "done"}


def test_lease_lost_ack_rolls_back_the_consumer_writes(runtime, registry, effects_table):
    """A consumer that outlives its lease while another run re-claims the delivery must not apply twice."""
    from cronbox.outbox.events import deliveries as store

    @consumer("slow", name="slow", registry=registry)
    def slow(event, ctx):
        ctx.session.execute(insert(effects).values(consumer="slow", event_id=event.id))
        # Stand-in for "the lease expired and another run claimed it": the token is no longer ours.
        ctx.session.execute(store.D.update().values(claim_token="another-run"))

    with runtime.sessions.begin() as session:
        cronbox.record(session, "slow", {})
    stats = relay(runtime)
    assert stats.lease_lost == 1 and stats.done == 0
    assert effect_counts(runtime) == Counter()


def test_timeout_interrupts_a_consumer_discards_its_connection_and_the_run_goes_on(runtime, registry, effects_table):
    import time as _time

    # 2 s: the quick item's INSERT ends well within it however loaded the machine; the slow one sleeps
    # 60 s, which the run would take were the timer not to interrupt it.
    @consumer("t", name="sleepy", timeout=2, backoff=[60], registry=registry)
    def sleepy(event, ctx):
        ctx.session.execute(insert(effects).values(consumer="sleepy", event_id=event.id))
        if event.payload["slow"]:
            _time.sleep(60)

    with runtime.sessions.begin() as session:
        cronbox.record(session, "t", {"slow": True})
        cronbox.record(session, "t", {"slow": False})
    started = _time.monotonic()
    stats = relay(runtime, max_time=120)
    assert _time.monotonic() - started < 30  # interrupted, not the handler's 60 s
    slow, quick = deliveries(runtime)
    assert slow.status == "pending" and slow.attempts == 1 and "HandlerTimeout" in slow.last_error
    assert quick.status == "done"
    assert stats.retried == 1 and stats.done == 1
    assert effect_counts(runtime) == Counter({("sleepy", quick.event_id): 1})  # the interrupted write rolled back


def test_an_item_whose_lease_ran_out_during_the_batch_is_not_started_twice(runtime, registry, settings):
    """Leases are the handler's timeout (no margin here); each item takes 0.6 of it, so the batch's
    third item waits 1.2 timeouts. Another run claims it meanwhile: the first run must notice before
    starting it (its lease can't be extended) and leave it to the other.
    The handlers move a frozen clock rather than sleep: a sleep's real time on a loaded machine
    would let the second item's lease run out as well. And the timeout is long in real time: its
    timer is real (SIGALRM), and on a loaded machine the other run inside the second item outlasted a
    1 s one."""
    from cronbox.outbox.engine.runtime import Runtime
    from cronbox.outbox.engine.registry import Registry

    timeout = 300
    runs = []
    other_registry = Registry()
    other = Runtime(settings, registry=other_registry)
    consumer("slow", name="slow", timeout=timeout, registry=other_registry)(
        lambda event, ctx: runs.append(("other", event.payload["n"])))

    @consumer("slow", name="slow", timeout=timeout, registry=registry)
    def slow(event, ctx):
        runs.append(("first", event.payload["n"]))
        clock.advance(0.6 * timeout)
        if event.payload["n"] == 1:
            relay(other)  # the third item's lease has run out by now: the other run takes it

    try:
        with clock.frozen(T0):
            with runtime.sessions.begin() as session:
                for n in range(3):
                    cronbox.record(session, "slow", {"n": n})
            stats = relay(runtime)
    finally:
        other.dispose()
    assert sorted(runs) == [("first", 0), ("first", 1), ("other", 2)]
    assert stats.done == 2 and stats.lease_lost == 1
    assert [d.status for d in deliveries(runtime)] == ["done", "done", "done"]


def test_blocked_keys_read_from_the_waiting_side(runtime):
    """Key a: a dead holder, then a retrying one (holds too), then a fresh one; key b: dead, nothing behind
    it (blocks nothing); key c: only fresh work. Counted and listed as the holders see it."""
    from cronbox.outbox.events import deliveries as store
    from cronbox.outbox.events.models import Delivery, OutboxEvent

    now = clock.utcnow()
    rows = [("a", "dead", 3), ("a", "pending", 1), ("a", "pending", 0), ("b", "dead", 3), ("c", "pending", 0),
            ("c", "pending", 0)]
    ids = []
    with runtime.sessions.begin() as session:
        for key, status, attempts in rows:
            event = OutboxEvent(type="t", key=key, payload="{}", trace_id="t" * 16, created_at=now, available_at=now,
                                fanned_out_at=now)
            session.add(event)
            session.flush()
            delivery = Delivery(event_id=event.id, consumer="sms", key=key, status=status, attempts=attempts,
                                next_attempt_at=now, created_at=now)
            session.add(delivery)
            session.flush()
            ids.append(delivery.id)
    with runtime.sessions() as session:
        listed = [(r.key, r.id, r.status, r.waiting) for r in store.blocked_keys(session)]
        per_consumer = store.status(session, now)
    assert listed == [("a", ids[0], "dead", 2), ("a", ids[1], "pending", 1)]
    sms = per_consumer["sms"]
    assert (sms.pending, sms.due, sms.dead, sms.blocked_keys) == (4, 4, 2, 1)
