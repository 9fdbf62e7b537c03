"""The job queue on every backend: dispatch, unique jobs, retries, RetryLater, failures, priority, limits."""
from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, insert, select

from cronbox import outbox
import cronbox
from cronbox.outbox.channels.models import Notification
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from cronbox.outbox.queue.worker import Worker
from tests.helpers import invoke, relay

T0 = datetime(2026, 11, 30, 12, 0, 0)


@pytest.fixture
def jobs(registry):
    return registry


@pytest.fixture
def rt(settings, registry, jobs, runtime):
    """The migrated runtime, with a fresh registry (`jobs` is the same registry)."""
    return runtime


def work(rt, queues=None, **budget):
    worker = Worker(rt, queues)
    worker.run(Budget(max_time=budget.pop("max_time", 30), memory_mb=budget.pop("memory_mb", None), **budget))
    return worker.stats


def all_jobs(rt) -> list[Job]:
    with rt.sessions() as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def test_rolled_back_dispatch_leaves_no_job_committed_runs_once(rt, jobs):
    seen = []

    @job("mail", name="mail", registry=jobs)
    def mail(payload, ctx):
        seen.append((payload, ctx.attempt, ctx.idempotency_key.startswith("job-")))

    with rt.sessions() as session:
        mail.dispatch(session, {"to": "a"})
        session.rollback()
    with rt.sessions.begin() as session:
        job_id = mail.dispatch(session, {"to": "b"})
    assert isinstance(job_id, int)
    stats = work(rt)
    work(rt)
    assert seen == [({"to": "b"}, 1, True)]
    assert stats.done == 1
    [row] = all_jobs(rt)
    assert row.status == "done" and row.available_at is None and row.claim_token is None


def test_dispatch_on_a_core_connection_commits_or_rolls_back_with_it(rt, jobs):
    seen = []

    @job("mail", name="mail", unique=True, registry=jobs)
    def mail(payload, ctx):
        seen.append(payload)

    with rt.engine.connect() as connection:
        with connection.begin() as tx:
            assert isinstance(mail.dispatch(connection, {"to": "a"}), int)
            tx.rollback()
        with connection.begin():
            assert isinstance(mail.dispatch(connection, {"to": "b"}), int)
            assert mail.dispatch(connection, {"to": "b"}) is None  # unique: already waiting
    work(rt)
    assert seen == [{"to": "b"}]


def test_non_json_payload_is_refused_at_dispatch(rt, jobs):
    @job(name="x", registry=jobs)
    def x(payload, ctx):
        pass

    with rt.sessions() as session:
        with pytest.raises(PayloadError, match=r"payload\['at'\] is a datetime"):
            x.dispatch(session, {"at": datetime.now()})
        session.commit()
    assert all_jobs(rt) == []


def test_a_unique_key_with_a_nul_or_not_utf8_is_refused_on_every_backend(rt, jobs):
    @job(name="x", unique=True, registry=jobs)
    def x(payload, ctx):
        pass

    with rt.sessions() as session:
        with pytest.raises(PayloadError, match="NUL"):
            x.dispatch(session, {}, unique_key="a\x00b")
        with pytest.raises(PayloadError, match="UTF-8"):
            x.dispatch(session, {}, unique_key="a\udcffb")
        with pytest.raises(PayloadError, match=r"payload\['name'\] is not UTF-8"):
            x.dispatch(session, {"name": "a\udcffb"})
        assert x.dispatch(session, {}, unique_key="a b") is not None  # the transaction goes on
        session.commit()
    assert len(all_jobs(rt)) == 1


def test_unique_dispatch_is_a_no_op_that_keeps_the_callers_transaction(rt, jobs):
    @job("sms", name="otp", unique=True, registry=jobs)
    def otp(payload, ctx):
        pass

    with rt.sessions() as session:
        first = otp.dispatch(session, {"user": 1})
        assert first is not None
        assert otp.dispatch(session, {"user": 1}) is None  # same payload: same default key
        session.execute(select(1))  # the transaction is still usable
        session.commit()
    with rt.sessions() as session:
        assert otp.dispatch(session, {"user": 1}) is None  # committed one is pending
        assert otp.dispatch(session, {"user": 2}, unique_key="user:2") is not None
        session.rollback()
    assert len(all_jobs(rt)) == 1
    work(rt)
    with rt.sessions.begin() as session:  # the key is free once the job finished
        assert otp.dispatch(session, {"user": 1}) is not None
    assert [j.status for j in all_jobs(rt)] == ["done", "ready"]


def test_unique_key_is_freed_when_the_job_fails_for_good(rt, jobs):
    @job(name="fragile", tries=1, registry=jobs)
    def fragile(payload, ctx):
        raise RuntimeError("boom")

    with rt.sessions.begin() as session:
        fragile.dispatch(session, {}, unique_key="k")
    work(rt)
    with rt.sessions.begin() as session:
        assert fragile.dispatch(session, {}, unique_key="k") is not None


def test_backoff_then_failed_with_error_class_message_traceback_and_trace(rt, jobs):
    @job(name="flaky", tries=3, backoff=5, registry=jobs)
    def flaky(payload, ctx):
        raise ConnectionError("gateway timeout")

    with clock.frozen(T0):
        with rt.sessions.begin() as session:
            flaky.dispatch(session, {})
        waits = []
        for _ in range(3):
            work(rt)
            [row] = all_jobs(rt)
            if row.status == "failed":
                break
            waits.append((row.available_at - clock.utcnow()).total_seconds())
            clock.advance(waits[-1] + 0.001)
    assert len(waits) == 2 and 4 <= waits[0] <= 6 and 8 <= waits[1] <= 12
    assert row.status == "failed" and row.attempts == 3
    assert row.error_class == "ConnectionError" and row.last_error == "ConnectionError: gateway timeout"
    assert "Traceback" in row.traceback and "gateway timeout" in row.traceback
    assert len(row.trace_id) == 16


def test_list_backoff(rt, jobs):
    @job(name="listed", tries=4, backoff=[1, 30, 300], registry=jobs)
    def listed(payload, ctx):
        raise RuntimeError("no")

    with clock.frozen(T0):
        with rt.sessions.begin() as session:
            listed.dispatch(session, {})
        waits = []
        for _ in range(3):
            work(rt)
            [row] = all_jobs(rt)
            waits.append(round((row.available_at - clock.utcnow()).total_seconds()))
            clock.advance(waits[-1])
    assert waits == [1, 30, 300]


def test_retry_later_uses_no_attempt_and_stops_at_retry_until(rt, jobs):
    calls = []

    @job(name="throttled", tries=2, retry_until=timedelta(minutes=10), registry=jobs)
    def throttled(payload, ctx):
        calls.append(ctx.attempt)
        raise cronbox.RetryLater(120, "flood wait")

    with clock.frozen(T0):
        with rt.sessions.begin() as session:
            throttled.dispatch(session, {})
        for _ in range(10):
            work(rt)
            [row] = all_jobs(rt)
            if row.status == "failed":
                break
            assert row.attempts == 0  # RetryLater refunded the attempt
            assert row.available_at <= T0 + timedelta(minutes=10)
            clock.advance(121)
    # Runs at 0, 121, 242, 363, 484 s; the wait after that is cut to the 600 s deadline; the run at
    # 605 s asks to wait again after retry_until has passed: failed.
    assert calls == [1, 1, 1, 1, 1, 1]
    assert row.status == "failed" and "retry_until has passed" in row.last_error
    assert row.attempts == 0  # the last RetryLater used no attempt either (issue 35: it kept its claim's)


def test_permanent_failure_fails_at_once(rt, jobs):
    @job(name="invalid", tries=5, registry=jobs)
    def invalid(payload, ctx):
        raise cronbox.PermanentFailure("invalid number")

    with rt.sessions.begin() as session:
        invalid.dispatch(session, {})
    work(rt)
    [row] = all_jobs(rt)
    assert row.status == "failed" and row.attempts == 1 and row.error_class == "PermanentFailure"


def test_timeout_stops_a_sleeping_job_and_counts_the_attempt(rt, jobs):
    @job(name="sleepy", tries=2, timeout=0.3, backoff=[60], registry=jobs)
    def sleepy(payload, ctx):
        ctx.session.execute(insert(Notification).values(recipient="u", kind="k", title="t", body="b",
                                                        created_at=clock.utcnow()))
        time.sleep(60)

    with rt.sessions.begin() as session:
        sleepy.dispatch(session, {})
    started = time.monotonic()
    stats = work(rt, max_time=120)
    assert time.monotonic() - started < 30  # interrupted, not the handler's 60 s
    [row] = all_jobs(rt)
    assert row.status == "ready" and row.attempts == 1 and "HandlerTimeout" in row.last_error
    assert stats.retried == 1
    with rt.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Notification)) == 0  # rolled back


def test_ctx_session_writes_commit_with_the_ack(rt, jobs):
    @job("notifications", name="notify", registry=jobs)
    def notify(payload, ctx):
        ctx.session.add(Notification(recipient=payload["to"], kind="welcome", title="Hi", body="...",
                                     dedupe_key=ctx.idempotency_key, created_at=clock.utcnow()))

    with rt.sessions.begin() as session:
        notify.dispatch(session, {"to": "user-1"})
    work(rt)
    work(rt)
    with rt.sessions() as session:
        assert session.scalars(select(Notification.recipient)).all() == ["user-1"]


def test_consumers_dispatch_jobs_atomically_with_their_ack(rt, jobs, registry):
    attempts = []

    @job("sms", name="sms", registry=jobs)
    def sms(payload, ctx):
        pass

    @consumer("order.paid", name="dispatcher", backoff=[0], registry=registry)
    def dispatcher(event, ctx):
        sms.dispatch(ctx.session, {"order": event.payload["id"]})
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("fails after dispatching")  # the dispatch must roll back with it

    with rt.sessions.begin() as session:
        cronbox.record(session, "order.paid", {"id": 9})
    relay(rt)  # fails once (backoff 0), then succeeds in the same run
    assert len(attempts) == 2
    assert [j.payload for j in all_jobs(rt)] == ['{"order":9}']  # the failed attempt's dispatch rolled back


def test_strict_priority_order(rt, jobs):
    order = []

    @job("sms", name="sms", registry=jobs)
    def sms(payload, ctx):
        order.append(("sms", payload))

    @job("notifications", name="note", registry=jobs)
    def note(payload, ctx):
        order.append(("note", payload))
        if payload == 0:
            sms.dispatch(ctx.session, 99)  # arrives while notifications run: it goes next

    with rt.sessions.begin() as session:
        for n in range(3):
            note.dispatch(session, n)
            sms.dispatch(session, n)
    worker = Worker(rt, ["sms", "notifications"], batch_size=1)
    worker.run(Budget(max_time=30, memory_mb=None))
    assert order == [("sms", 0), ("sms", 1), ("sms", 2), ("note", 0), ("sms", 99), ("note", 1), ("note", 2)]


def test_the_claim_takes_due_jobs_in_queue_priority_and_passes_over_unregistered_handlers(rt, jobs):
    """Queues are claimed from in priority order, and a queue whose due jobs belong to handlers not
    registered here is passed over (its jobs wait for a worker that has them)."""
    ran = []
    for queue in ("q1", "q2", "q3", "q4"):
        job(queue, name=f"job-{queue}", registry=jobs)(lambda payload, ctx, queue=queue: ran.append((queue, payload)))
    elsewhere = Registry()
    stranger = job("q1", name="stranger", registry=elsewhere)(lambda payload, ctx: None)
    quiet = Worker(rt, ["q1", "q2", "q3", "q4"])
    assert quiet.run(Budget(max_time=30, memory_mb=None)) == 0  # nothing due: nothing claimed
    with rt.sessions.begin() as session:
        stranger.dispatch(session, "not ours")
        jobs.jobs.get("job-q4").dispatch(session, "low")
        jobs.jobs.get("job-q2").dispatch(session, "high")
    worker = Worker(rt, ["q1", "q2", "q3", "q4"], batch_size=1)
    worker.run(Budget(max_time=30, memory_mb=None))
    assert ran == [("q2", "high"), ("q4", "low")]
    assert [j.status for j in all_jobs(rt)] == ["ready", "done", "done"]


def test_jobs_of_unregistered_handlers_wait(rt, jobs, settings):
    @job(name="known", registry=jobs)
    def known(payload, ctx):
        pass

    other = Registry()

    @job(name="elsewhere", registry=other)
    def elsewhere(payload, ctx):
        pass

    with rt.sessions.begin() as session:
        known.dispatch(session, {})
        elsewhere.dispatch(session, {})
    work(rt, ["default"])
    assert [j.status for j in all_jobs(rt)] == ["done", "ready"]


def test_rate_limit_shared_via_the_database_defers_without_attempts(rt, jobs):
    ran = []

    @job("sms", name="limited", rate_limit="2/m", registry=jobs)
    def limited(payload, ctx):
        ran.append(payload)

    with clock.frozen(T0):
        with rt.sessions.begin() as session:
            for n in range(5):
                limited.dispatch(session, n)
        stats = work(rt)
        assert ran == [0, 1] and stats.deferred == 3
        assert all(j.attempts == 0 for j in all_jobs(rt) if j.status == "ready")
        clock.advance(60)
        work(rt)
        assert ran == [0, 1, 2, 3]
        clock.advance(60)
        work(rt)
    assert ran == [0, 1, 2, 3, 4]


def test_a_channel_pause_makes_its_jobs_wait_without_attempts(rt, jobs):
    sent = []

    @job("sms", name="send", channel="sms", registry=jobs)
    def send(payload, ctx):
        if payload == "credit-gone":
            raise outbox.ChannelPaused("sms", 600, "out of credit")
        sent.append(payload)

    with clock.frozen(T0):
        with rt.sessions.begin() as session:
            send.dispatch(session, "credit-gone")
            send.dispatch(session, "hello")
        stats = work(rt)
        assert sent == [] and stats.deferred == 2
        assert all(j.attempts == 0 and j.status == "ready" for j in all_jobs(rt))
        clock.advance(601)
        with rt.sessions.begin() as session:
            session.execute(Job.__table__.delete().where(Job.payload == '"credit-gone"'))
        work(rt)
    assert sent == ["hello"]


def test_max_jobs_and_memory_limits(rt, jobs):
    @job(name="n", registry=jobs)
    def n(payload, ctx):
        pass

    with rt.sessions.begin() as session:
        for i in range(5):
            n.dispatch(session, i)
    stats = work(rt, max_handled=2)
    assert stats.done == 2
    assert all(j.claim_token is None for j in all_jobs(rt))  # the rest released, not leased
    stats = work(rt, memory_mb=8)
    assert stats.done == 0
    assert [j.attempts for j in all_jobs(rt)] == [1, 1, 0, 0, 0]


def test_idempotency_keys_stay_unique_when_pruned_ids_come_back(rt, jobs):
    """SQLite gives a pruned row's id to the next row; keys (kept in notifications, send attempts)
    must not repeat, or the new job's notification would be taken for the old one's."""
    keys = []

    @job("notifications", name="keyed", registry=jobs)
    def keyed(payload, ctx):
        keys.append(ctx.idempotency_key)

    for _ in range(2):
        with rt.sessions.begin() as session:
            keyed.dispatch(session, {})
        work(rt)
        with rt.sessions.begin() as session:
            session.execute(Job.__table__.delete())  # queue prune
    assert len(set(keys)) == 2 and all(k.startswith("job-") for k in keys)


def test_the_backlog_counts_in_one_statement_what_the_relay_and_the_worker_could_do_now(rt, jobs):
    """The tick's heartbeat backlog: unfanned events, due pending deliveries and due jobs, one statement."""
    from cronbox.outbox.events import deliveries
    from cronbox.outbox.queue import jobstore

    @job("mail", name="mail", registry=jobs)
    def mail(payload, ctx):
        pass

    with rt.sessions.begin() as session:
        cronbox.record(session, "order.placed", {"n": 1})
        cronbox.record(session, "order.placed", {"n": 2})
        mail.dispatch(session, {"due": True})
        mail.dispatch(session, {"due": False}, delay=3600)
    now = clock.utcnow() + timedelta(seconds=1)
    with rt.sessions() as session:
        assert deliveries.backlog(session, now) == 2 and jobstore.backlog(session, now) == 1
        assert session.scalar(select(deliveries.backlog_count(now) + jobstore.backlog_count(now))) == 3


@pytest.mark.backends("mysql-skip-locked")
@pytest.mark.parametrize("siblings", [True, False])
def test_a_pool_child_whose_claim_finds_the_backlog_locked_by_a_sibling_looks_again(rt, jobs, siblings):
    """Three children claiming at one moment: one's SKIP LOCKED can pass over every due job while
    the others' claims hold their rows. A pool child (siblings=True) checks that due jobs remain,
    looks again a moment later and takes them; a lone worker ends as empty, as it always has."""
    import threading

    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    seen = []

    @job("held", name="held", registry=jobs)
    def held(payload, ctx):
        seen.append(payload["n"])

    with rt.sessions.begin() as session:
        for n in range(3):
            held.dispatch(session, {"n": n})
    other = create_engine(rt.engine.url, poolclass=NullPool)  # another child's own connection
    sibling = other.connect()  # its claim in progress: the rows locked, not yet taken
    locked = sibling.begin()
    sibling.execute(text("SELECT id FROM cronbox_jobs WHERE status = 'ready' FOR UPDATE")).all()
    release = threading.Timer(0.12, locked.rollback)  # ... which then ends without taking them
    release.start()
    try:
        worker = Worker(rt, ["held"], siblings=siblings)
        worker.run(Budget(max_time=30, memory_mb=None))
    finally:
        release.join()
        sibling.close()
        other.dispose()
    assert sorted(seen) == ([0, 1, 2] if siblings else [])
    assert worker.stats.done == (3 if siblings else 0)


def claim_mail(rt, jobs, now, limit: int = 10) -> list:
    from cronbox.outbox.queue import jobstore

    with rt.sessions.begin() as session:
        return jobstore.claim_due(session, jobs.jobs, "mail", now=now, limit=limit, mode=rt.claim_mode(), lease_margin=0)


def test_a_job_whose_lease_ran_out_is_claimed_alone_before_the_ready_ones(rt, jobs):
    """Its worker died, perhaps because of it: claimed in a batch it would cost every batch-mate an
    attempt each time it kills a worker again. A lease still running is left to its holder. The same on
    every backend and claim path (PostgreSQL's is one statement: the next test)."""
    @job("mail", name="mail", timeout=30, registry=jobs)
    def mail(payload, ctx):
        pass

    with rt.sessions.begin() as session:
        ids = [mail.dispatch(session, {"n": n}) for n in range(4)]
    now = clock.utcnow() + timedelta(seconds=1)
    [first] = claim_mail(rt, jobs, now, limit=1)
    [second] = claim_mail(rt, jobs, now, limit=1)
    assert (first.id, second.id, first.attempts) == (ids[0], ids[1], 1)
    with rt.sessions.begin() as session:  # the first one's worker died: its lease ran out
        session.get(Job, ids[0]).available_at = now - timedelta(seconds=1)

    [again] = claim_mail(rt, jobs, now)
    assert (again.id, again.attempts) == (ids[0], 2) and again.claim_token != first.claim_token
    assert [(c.id, c.attempts) for c in claim_mail(rt, jobs, now)] == [(ids[2], 1), (ids[3], 1)]
    assert claim_mail(rt, jobs, now) == []  # the leases run: their holders'
    with rt.sessions.begin() as session:  # every worker died, the leases running out in reverse id order
        for n, job_id in enumerate(ids):
            session.get(Job, job_id).available_at = now - timedelta(seconds=n + 1)
    # Each claimed alone, the oldest lease first (not the lowest id).
    assert [[c.id for c in claim_mail(rt, jobs, now)] for _ in range(5)] == [[i] for i in reversed(ids)] + [[]]


def test_each_handler_of_a_queue_gets_its_own_lease(rt, jobs):
    """A claim of several handlers' jobs leases each for its own handler's timeout (PostgreSQL binds one
    lease per handler into its one-statement claim; the other paths write the same CASE)."""
    @job("mail", name="mail.quick", timeout=10, registry=jobs)
    def quick(payload, ctx):
        pass

    @job("mail", name="mail.slow", timeout=300, registry=jobs)
    def slow(payload, ctx):
        pass

    with rt.sessions.begin() as session:
        ids = [quick.dispatch(session, {}), slow.dispatch(session, {}), quick.dispatch(session, {})]
    now = clock.utcnow() + timedelta(seconds=1)
    claimed = claim_mail(rt, jobs, now)
    assert [(c.id, c.handler, c.lease_until) for c in claimed] == [
        (ids[0], "mail.quick", now + timedelta(seconds=10)), (ids[1], "mail.slow", now + timedelta(seconds=300)),
        (ids[2], "mail.quick", now + timedelta(seconds=10))]
    with rt.sessions() as session:
        assert [session.get(Job, i).available_at for i in ids] == [c.lease_until for c in claimed]


@pytest.mark.backends("postgresql")
def test_a_claim_on_postgresql_is_one_statement(rt, jobs):
    """A worker woken by NOTIFY starts its job a claim later: on PostgreSQL that claim is one statement
    (with its COMMIT), where the other servers' paths need three or more."""
    from sqlalchemy import event

    @job("mail", name="mail", registry=jobs)
    def mail(payload, ctx):
        pass

    with rt.sessions.begin() as session:
        ids = [mail.dispatch(session, {"n": n}) for n in range(3)]
    statements: list[str] = []
    event.listen(rt.engine, "before_cursor_execute", lambda conn, cursor, statement, *rest: statements.append(statement))
    claimed = claim_mail(rt, jobs, clock.utcnow() + timedelta(seconds=1))
    assert [c.id for c in claimed] == ids and len(statements) == 1, statements
