"""Group commit (`grouped=True`): consecutive grouped items in one transaction, each handler in its own
savepoint, one COMMIT; a lost group (timeout, deadlock, dropped connection) runs its members again
one per transaction without costing them an attempt."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from datetime import datetime

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, event, func, insert, select, text, update

import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from cronbox.outbox.queue.worker import Worker
from tests.helpers import deliveries, relay, wait_for

T0 = datetime(2026, 12, 1, 12, 0, 0)

meta = MetaData()
effects = Table("test_group_effects", meta, Column("id", Integer, primary_key=True),
                Column("consumer", String(64)), Column("item", Integer))
locks = Table("test_group_locks", meta, Column("id", Integer, primary_key=True), Column("n", Integer))
filler = Table("test_group_filler", meta, Column("id", Integer, primary_key=True), Column("n", Integer))


@pytest.fixture(autouse=True)
def leases(runtime):
    """The suite's CRONBOX_LEASE_MARGIN=0 makes leases just the handler's timeout: a member joins a group
    only while its lease covers its timeout plus the group's time, so give them the default margin.
    And a time bound no loaded test machine reaches, so the groups are what each test says (the
    time bound has its own test): CRONBOX_GROUP_MS, and CRONBOX_ACK_FLUSH, which caps it (0.5 s by
    default: a loaded machine's group of a few members outlasted it, and split)."""
    runtime.settings = dataclasses.replace(runtime.settings, lease_margin=30.0, group_ms=20_000, ack_flush=20.0)


@pytest.fixture
def tables(runtime):
    meta.create_all(runtime.engine)
    with runtime.engine.begin() as connection:
        connection.execute(insert(locks), [{"id": 1, "n": 0}, {"id": 2, "n": 0}])
    return effects


class Commits:
    """The sizes of the committed transactions that inserted effect rows: how items were grouped."""

    def __init__(self, engine):
        self.sizes: list[int] = []
        self._pending = 0
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)
        event.listen(engine, "rollback", self._rollback)

    def _statement(self, connection, cursor, statement, *args):
        if statement.lstrip().upper().startswith("INSERT INTO TEST_GROUP_EFFECTS"):
            self._pending += 1

    def _commit(self, connection):
        if self._pending:
            self.sizes.append(self._pending)
        self._pending = 0

    def _rollback(self, connection):
        self._pending = 0


def effect_counts(runtime) -> Counter:
    with runtime.sessions() as s:
        return Counter(dict(s.execute(select(effects.c.item, func.count()).group_by(effects.c.item)).all()))


def record(runtime, event_type: str, count: int, **kwargs) -> list[int]:
    with runtime.sessions.begin() as session:
        events = [cronbox.record(session, event_type, {"n": n}, **kwargs) for n in range(count)]
        session.flush()
        return [e.id for e in events]


def write(ctx, name: str, item: int) -> None:
    ctx.session.execute(insert(effects).values(consumer=name, item=item))


def test_grouped_writes_and_acks_commit_once_in_one_transaction(runtime, registry, tables):
    @consumer("g", name="grouped", grouped=True, registry=registry)
    def grouped(event, ctx):
        write(ctx, "grouped", event.id)

    @consumer("u", name="ungrouped", registry=registry)
    def ungrouped(event, ctx):
        write(ctx, "ungrouped", event.id)

    ids = record(runtime, "g", 7)
    commits = Commits(runtime.engine)
    stats = relay(runtime)
    assert stats.done == 7 and commits.sizes == [7]  # seven writes and acks, one COMMIT
    assert effect_counts(runtime) == Counter({i: 1 for i in ids})
    assert all(d.status == "done" and d.attempts == 1 and d.claim_token is None for d in deliveries(runtime))

    more = record(runtime, "u", 3)
    relay(runtime)
    assert commits.sizes == [7, 1, 1, 1]  # ungrouped: one transaction each, as before
    assert effect_counts(runtime) == Counter({i: 1 for i in ids + more})


def test_savepoints_on_cronbox_engines_are_sqlalchemys_and_nest_and_undo(runtime, tables):
    """A group's savepoints are SQLAlchemy's own (its dialect's methods, never replaced on cronbox's
    engine): sent through the Connection, where a listener sees them, undoing and keeping writes."""
    sent = []

    def statement(connection, cursor, text, *args):
        sent.append(text.split()[0].upper())

    event.listen(runtime.engine, "before_cursor_execute", statement)
    try:
        with runtime.engine.connect() as connection, connection.begin():
            connection.execute(insert(effects), {"consumer": "kept", "item": 1})
            undone = connection.begin_nested()
            connection.execute(insert(effects), {"consumer": "undone", "item": 2})
            undone.rollback()
            released = connection.begin_nested()
            connection.execute(insert(effects), {"consumer": "released", "item": 3})
            released.commit()
    finally:
        event.remove(runtime.engine, "before_cursor_execute", statement)
    assert sent.count("SAVEPOINT") == 2 and "ROLLBACK" in sent and "RELEASE" in sent
    with runtime.sessions() as session:
        assert set(session.scalars(select(effects.c.consumer))) == {"kept", "released"}
    dialect = runtime.engine.dialect
    assert all(name not in vars(dialect) for name in ("do_savepoint", "do_rollback_to_savepoint", "do_release_savepoint"))


def test_a_failing_handler_rolls_back_only_its_own_writes_and_is_rescheduled_in_the_group(runtime, registry, tables):
    @consumer("g", name="grouped", grouped=True, backoff=[60], max_attempts=3, registry=registry)
    def grouped(event, ctx):
        write(ctx, "grouped", event.id)
        if event.payload["n"] == 2:
            raise RuntimeError("broken record")
        if event.payload["n"] == 4:
            raise cronbox.PermanentFailure("never valid")

    ids = record(runtime, "g", 6)
    commits = Commits(runtime.engine)
    stats = relay(runtime)
    assert len(commits.sizes) == 1  # the failures' savepoints rolled back, their records in the same COMMIT
    assert effect_counts(runtime) == Counter({i: 1 for n, i in enumerate(ids) if n not in (2, 4)})
    rows = {d.event_id: d for d in deliveries(runtime)}
    assert rows[ids[2]].status == "pending" and rows[ids[2]].attempts == 1
    assert "broken record" in rows[ids[2]].last_error and rows[ids[2]].claim_token is None
    assert rows[ids[4]].status == "dead" and "never valid" in rows[ids[4]].last_error
    assert stats.done == 4 and stats.retried == 1 and stats.gave_up == 1


def test_a_handler_that_left_its_session_failed_or_calls_commit_now_fails_alone(runtime, registry, tables):
    from sqlalchemy.exc import IntegrityError

    @consumer("g", name="grouped", grouped=True, backoff=[60], registry=registry)
    def grouped(event, ctx):
        n = event.payload["n"]
        write(ctx, "grouped", event.id)
        if n == 1:
            try:  # a duplicate primary key, caught and not rolled back
                ctx.session.execute(insert(effects).values(id=1, consumer="dup", item=0))
                ctx.session.execute(insert(effects).values(id=1, consumer="dup", item=0))
            except IntegrityError:
                pass
        if n == 2:
            ctx.commit_now()

    ids = record(runtime, "g", 4)
    relay(runtime)
    rows = {d.event_id: d for d in deliveries(runtime)}
    assert "left ctx.session failed" in rows[ids[1]].last_error
    assert "not available to a grouped handler" in rows[ids[2]].last_error
    assert effect_counts(runtime) == Counter({ids[0]: 1, ids[3]: 1})


def test_the_group_is_bounded_in_count(runtime, registry, tables):
    runtime.settings = dataclasses.replace(runtime.settings, group_max=3)

    @consumer("g", name="grouped", grouped=True, registry=registry)
    def grouped(event, ctx):
        write(ctx, "grouped", event.id)

    ids = record(runtime, "g", 8)
    commits = Commits(runtime.engine)
    relay(runtime)
    assert commits.sizes == [3, 3, 2]
    assert effect_counts(runtime) == Counter({i: 1 for i in ids})


def test_the_group_is_bounded_in_time(runtime, registry, tables):
    """No member joins once CRONBOX_GROUP_MS has passed since the group began: with 40 ms handlers and
    a 60 ms bound, a group has at most two members (the second starts at 40 ms, ends past 60)."""
    runtime.settings = dataclasses.replace(runtime.settings, group_ms=60)

    @consumer("g", name="grouped", grouped=True, registry=registry)
    def grouped(event, ctx):
        write(ctx, "grouped", event.id)
        time.sleep(0.04)

    ids = record(runtime, "g", 6)
    commits = Commits(runtime.engine)
    relay(runtime)
    assert sum(commits.sizes) == 6 and max(commits.sizes) <= 2
    assert effect_counts(runtime) == Counter({i: 1 for i in ids})


def test_a_timeout_loses_the_group_and_the_others_run_again_alone_without_losing_an_attempt(
        runtime, registry, tables):
    # 2 s: each other member's write ends well within it however loaded the machine (a timeout of
    # theirs would make them dead too); the slow one sleeps until the timer ends it.
    @consumer("g", name="grouped", grouped=True, timeout=2, backoff=[60], max_attempts=1, registry=registry)
    def grouped(event, ctx):
        write(ctx, "grouped", event.id)
        if event.payload["n"] == 2:
            time.sleep(60)

    ids = record(runtime, "g", 5)
    commits = Commits(runtime.engine)
    stats = relay(runtime)
    rows = {d.event_id: d for d in deliveries(runtime)}
    slow = rows.pop(ids[2])
    # max_attempts=1: a neighbour's timeout would have made them dead had it cost them their attempt.
    assert all(d.status == "done" and d.attempts == 1 for d in rows.values())
    assert slow.status == "dead" and "HandlerTimeout" in slow.last_error and slow.attempts == 1
    assert effect_counts(runtime) == Counter({i: 1 for n, i in enumerate(ids) if n != 2})
    assert commits.sizes == [1, 1, 2]  # the lost group's two others alone, then the rest grouped again
    assert stats.done == 4 and stats.gave_up == 1


def test_a_handler_that_commits_then_fails_loses_the_group_and_nobody_else_pays(runtime, registry, tables):
    @consumer("g", name="grouped", grouped=True, backoff=[60], registry=registry)
    def grouped(event, ctx):
        write(ctx, "grouped", event.id)
        if event.payload["n"] == 1:
            ctx.session.commit()  # its savepoint is released: its writes can no longer be undone alone
            ctx.session.execute(insert(effects).values(consumer="more", item=-1))
            raise RuntimeError("after commit")

    ids = record(runtime, "g", 3)
    relay(runtime)
    rows = {d.event_id: d for d in deliveries(runtime)}
    assert rows[ids[0]].status == "done" and rows[ids[0]].attempts == 1
    assert rows[ids[2]].status == "done" and rows[ids[2]].attempts == 1
    # Run again alone, it failed there (its own attempt), its writes rolled back.
    assert rows[ids[1]].status == "pending" and rows[ids[1]].attempts == 1
    assert effect_counts(runtime) == Counter({ids[0]: 1, ids[2]: 1})


def test_per_key_order_holds_with_groups(runtime, registry, tables):
    order: list[tuple[str | None, int]] = []
    fail_once = {("k", 1)}

    @consumer("step", name="ordered", grouped=True, backoff=[5], registry=registry)
    def ordered(event, ctx):
        n = event.payload["n"]
        if (event.key, n) in fail_once:
            fail_once.discard((event.key, n))
            raise RuntimeError("transient")
        write(ctx, "ordered", event.id)
        order.append((event.key, n))

    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            for n in range(4):
                for key in ("k", "j", None):
                    cronbox.record(session, "step", {"n": n}, key=key)
        for _ in range(5):
            relay(runtime)
        clock.advance(6)
        for _ in range(5):
            relay(runtime)
    assert [n for key, n in order if key == "k"] == [0, 1, 2, 3]
    assert [n for key, n in order if key == "j"] == [0, 1, 2, 3]
    assert sorted(n for key, n in order if key is None) == [0, 1, 2, 3]


def test_grouped_jobs_commit_in_one_transaction_and_fail_alone(runtime, registry, tables):
    @job("gq", name="grouped-job", grouped=True, backoff=[60], registry=registry)
    def grouped_job(payload, ctx):
        ctx.session.execute(insert(effects).values(consumer="job", item=payload["n"]))
        if payload["n"] == 3:
            raise RuntimeError("bad job")

    with runtime.sessions.begin() as session:
        for n in range(6):
            grouped_job.dispatch(session, {"n": n})
    commits = Commits(runtime.engine)
    worker = Worker(runtime, ["gq"])
    worker.run(Budget(max_time=30, memory_mb=None))
    assert len(commits.sizes) == 1 and worker.stats.done == 5 and worker.stats.retried == 1
    assert effect_counts(runtime) == Counter({n: 1 for n in (0, 1, 2, 4, 5)})
    with runtime.sessions() as s:
        rows = {r.payload: r for r in s.scalars(select(Job))}
    assert rows['{"n":3}'].status == "ready" and rows['{"n":3}'].attempts == 1
    assert all(r.status == "done" and r.attempts == 1 for p, r in rows.items() if p != '{"n":3}')


def test_grouped_is_refused_where_it_cannot_hold():
    registry = Registry()
    with pytest.raises(RegistrationError, match="grouped must be True or False"):
        consumer("x", grouped="yes", registry=registry)
    with pytest.raises(RegistrationError, match="channel= or rate_limit="):
        job("q", grouped=True, channel="sms", registry=registry)
    with pytest.raises(RegistrationError, match="channel= or rate_limit="):
        job("q", grouped=True, rate_limit="5/s", registry=registry)
    from cronbox.outbox.channels import jobs as channel_jobs  # noqa: F401 (registers them) the built-in channels never opt in
    from cronbox.outbox.engine.registry import DEFAULT

    channels = [DEFAULT.jobs.get(name) for name in ("cronbox.sms", "cronbox.email", "cronbox.notify")]
    assert all(h is not None and not h.grouped for h in channels)


@pytest.mark.backends("mysql-skip-locked", "mysql-token")
def test_a_real_deadlock_loses_the_group_and_its_members_succeed_alone(runtime, registry, tables, database):
    """MariaDB's 1213 rolls back the whole group transaction, every savepoint in it: the members run
    again one per transaction, with no attempt lost. Made with a second connection that holds row 2,
    has written more rows than the group (so InnoDB picks the group as the victim), and waits for row 1,
    which the group's first member locked; the second member then asks for row 2."""
    other = create_engine(runtime.settings.database_url, isolation_level="READ COMMITTED")
    holding, waiting = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    rival_connection: list[int] = []

    def rival_waits_for_a_lock() -> bool:
        with other.connect() as connection:
            return bool(connection.execute(text(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = :id AND "
                "trx_state = 'LOCK WAIT'"), {"id": rival_connection[0]}).scalar())

    def rival():
        try:
            with other.begin() as connection:
                rival_connection.append(connection.execute(text("SELECT CONNECTION_ID()")).scalar())
                connection.execute(insert(filler), [{"n": i} for i in range(300)])
                connection.execute(update(locks).where(locks.c.id == 2).values(n=locks.c.n + 1))
                holding.set()
                assert waiting.wait(60)
                connection.execute(update(locks).where(locks.c.id == 1).values(n=locks.c.n + 1))
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    thread = threading.Thread(target=rival)
    attempts_seen: list[tuple[int, int]] = []

    @consumer("g", name="grouped", grouped=True, max_attempts=1, registry=registry)
    def grouped(event, ctx):
        n = event.payload["n"]
        attempts_seen.append((n, ctx.attempt))
        write(ctx, "grouped", event.id)
        if n == 0:
            ctx.session.execute(update(locks).where(locks.c.id == 1).values(n=locks.c.n + 1))
            if not thread.is_alive() and not holding.is_set():
                thread.start()
                assert holding.wait(20)  # (within the handler's 30 s timeout)
        if n == 1:
            if not waiting.is_set():
                waiting.set()
                wait_for(rival_waits_for_a_lock, "the rival to wait for row 1", timeout=20)  # (within the 30 s timeout)
            ctx.session.execute(update(locks).where(locks.c.id == 2).values(n=locks.c.n + 1))  # 1213 the first time

    ids = record(runtime, "g", 3)
    relay(runtime)
    thread.join(60)
    other.dispose()
    assert not errors, errors
    assert (1, 1) in attempts_seen and attempts_seen.count((1, 1)) == 2  # it ran again after the deadlock
    rows = deliveries(runtime)
    assert all(d.status == "done" and d.attempts == 1 for d in rows), [(d.status, d.last_error) for d in rows]
    assert effect_counts(runtime) == Counter({i: 1 for i in ids})
    with runtime.sessions() as s:
        assert dict(s.execute(select(locks.c.id, locks.c.n)).all()) == {1: 2, 2: 2}  # each update once, and the rival's


@pytest.mark.backends("mysql-skip-locked")
def test_a_dropped_connection_loses_the_group_and_its_members_succeed_alone(runtime, registry, tables, settings):
    from tests.tcp_proxy import TcpProxy

    cut = []
    with TcpProxy(3306) as proxy:
        proxied = Runtime(dataclasses.replace(settings, database_url=proxy.url(settings.database_url),
                                              lease_margin=30.0, group_ms=20_000, ack_flush=20.0),
                        registry=registry)

        @consumer("g", name="grouped", grouped=True, max_attempts=1, registry=registry)
        def grouped(event, ctx):
            write(ctx, "grouped", event.id)
            if event.payload["n"] == 2 and not cut:
                cut.append(proxy.cut())
                write(ctx, "grouped", event.id)  # the connection is gone

        ids = record(runtime, "g", 4)
        try:
            stats = relay(proxied)
        finally:
            proxied.dispose()
    assert cut and cut[0] >= 1
    assert all(d.status == "done" and d.attempts == 1 for d in deliveries(runtime))
    assert effect_counts(runtime) == Counter({i: 1 for i in ids})
    assert stats.done == 4


def test_an_interrupt_mid_group_commits_nothing_and_refunds_every_attempt(runtime, registry, tables):
    from cronbox.outbox.core.errors import SignalInterrupt

    @consumer("g", name="grouped", grouped=True, registry=registry)
    def grouped(event, ctx):
        write(ctx, "grouped", event.id)
        if event.payload["n"] == 2:
            raise SignalInterrupt()  # a real Ctrl-C while the third member runs

    record(runtime, "g", 5)
    with pytest.raises(SignalInterrupt):
        relay(runtime)
    assert effect_counts(runtime) == Counter()
    # Released with the claim's attempt refunded (`release`, token-guarded): due again, as if never claimed.
    assert all(d.status == "pending" and d.attempts == 0 and d.claim_token is None for d in deliveries(runtime))
