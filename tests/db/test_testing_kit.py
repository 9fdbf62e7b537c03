"""cronbox.testing on every backend: what the kit sees (only committed rows), what it runs (the real relay,
worker and tick, in process), the clock every time-dependent feature reads, the test driver's outbox,
inline mode, and the errors of bad use. Each assertion helper also fails, with its readable account,
when it should. The Flask side is tests/web/test_testing_kit_flask.py; the pytest plugin,
tests/processes/test_testing_plugin.py."""
from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, insert, select
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import QueuePool

from cronbox import RetryLater, record
from cronbox.cron.scheduling import schedule
from cronbox.outbox.channels.jobs import send_email, send_sms, send_webhook
from cronbox.outbox.core import clock as core_clock
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.jobs import job
from cronbox.testing import DrainLoop, Kit, KitError

T0 = datetime(2026, 12, 1, 9, 0, 0)

effects_meta = MetaData()
effects = Table("kit_effects", effects_meta, Column("id", Integer, primary_key=True), Column("what", String(64)))


@pytest.fixture
def env(env):
    """The suite's settings, with every channel on the test driver."""
    return {**env, "CRONBOX_SMS_DRIVER": "test", "CRONBOX_MAIL_DRIVER": "test", "CRONBOX_WEBHOOK_DRIVER": "test",
            "CRONBOX_ALERT_WEBHOOK_URL": "https://alerts.example/hook/SECRET-PATH",
            "CRONBOX_ALERT_WEBHOOK_SECRET": "s" * 32}


@pytest.fixture
def kit(runtime):
    effects_meta.create_all(runtime.engine)
    with Kit(runtime, now=T0) as started:
        yield started


@pytest.fixture
def app_sessions(runtime):
    """The sessions "the app" writes through: an engine of its own on the test database, as a user's."""
    engine = create_engine(runtime.engine.url)
    yield sessionmaker(engine)
    engine.dispose()


def written(runtime) -> list[str]:
    with runtime.sessions() as session:
        return list(session.scalars(select(effects.c.what).order_by(effects.c.id)))


def test_the_kit_sees_only_committed_rows_and_matches_payload_keys(kit, registry, app_sessions):
    follow = job("mail", name="follow", registry=registry)(lambda payload, ctx: None)
    with app_sessions() as session:
        record(session, "visit.paid", {"visit": 1})
        follow.dispatch(session, {"visit": 1})
        kit.refute_recorded("visit.paid")  # in the app's open transaction: not committed, not seen
        session.rollback()  # a refused request leaves nothing
    kit.refute_recorded()
    kit.refute_dispatched()
    with app_sessions.begin() as session:
        record(session, "visit.paid", {"visit": 2, "amount": "120.00"}, key="visit:2")
        follow.dispatch(session, {"visit": 2}, delay=60)
    [event] = kit.assert_recorded("visit.paid", visit=2)
    assert (event.type, event.key, event.payload, event.deliveries) == (
        "visit.paid", "visit:2", {"visit": 2, "amount": "120.00"}, ())
    assert kit.recorded("visit.paid", visit=1) == [] and kit.recorded(visit=2) == [event]
    [row] = kit.assert_dispatched(follow, queue="mail", visit=2)
    assert (row.job, row.status, row.attempts, row.available_at) == ("follow", "ready", 0, T0 + timedelta(seconds=60))
    assert kit.dispatched("follow") == [row] and kit.dispatched(queue="sms") == []


def test_each_assertion_fails_with_an_account_of_what_was_there(kit, registry, runtime):
    follow = job("mail", name="follow", registry=registry)(lambda payload, ctx: None)
    with pytest.raises(AssertionError) as empty:
        kit.assert_recorded("visit.paid")
    assert str(empty.value).splitlines() == [
        "no event 'visit.paid' was recorded",
        "no events at all (committed ones only: an uncommitted or rolled-back transaction leaves none)"]

    with runtime.sessions.begin() as session:
        record(session, "visit.paid", {"visit": 1, "to": "+989121234567"})
        record(session, "visit.booked", {"visit": 2})
        follow.dispatch(session, {"visit": 1})
    with pytest.raises(AssertionError) as missing:
        kit.assert_recorded("visit.paid", visit=3, to="+989121234567")
    assert str(missing.value).splitlines() == [
        "no event 'visit.paid' with visit=3, to='+989121234567' was recorded",
        "events there (2):",
        '  #1 visit.paid {"to": "+989121234567", "visit": 1} [not delivered yet]',
        "      visit: 1 (expected 3)",
        '  #2 visit.booked {"visit": 2} [not delivered yet]',
        "      type is 'visit.booked'",
        "      visit: 2 (expected 3)",
        "      to: missing (expected '+989121234567')"]

    with pytest.raises(AssertionError) as present:
        kit.refute_recorded("visit.booked")
    assert str(present.value).splitlines() == [
        "event 'visit.booked' was recorded 1 time(s), expected none",
        "matching events there (1):",
        '  #2 visit.booked {"visit": 2} [not delivered yet]']

    with pytest.raises(AssertionError) as no_job:
        kit.assert_dispatched(send_sms, queue="sms", visit=1)
    assert str(no_job.value).splitlines() == [
        "no job 'cronbox.sms' on queue 'sms' with visit=1 was dispatched",
        "jobs there (1):",
        '  #1 follow on mail (ready, attempts 0) {"visit": 1}',
        "      job is 'follow'",
        "      queue is 'mail'"]

    with pytest.raises(AssertionError) as a_job:
        kit.refute_dispatched("follow")
    assert str(a_job.value).splitlines() == [
        "job 'follow' was dispatched 1 time(s), expected none",
        "matching jobs there (1):",
        '  #1 follow on mail (ready, attempts 0) {"visit": 1}']


def test_a_consumer_and_the_job_it_dispatches_run_through_the_real_paths(kit, registry, runtime, app_sessions):
    """deliver() and drain(): fan-out, claim, ctx.session writes committed with the ack, a failing job
    retrying with its error text after its backoff (the test's clock), failed after its tries, a
    RetryLater keeping its attempt."""
    @consumer("visit.paid", name="receipt", registry=registry)
    def receipt(event, ctx):
        ctx.session.execute(insert(effects).values(what=f"receipt {event.payload['visit']}"))
        notify.dispatch(ctx.session, {"visit": event.payload["visit"]})

    calls = []

    @job("sms", name="notify", tries=3, backoff=[30, 60], registry=registry)
    def notify(payload, ctx):
        calls.append((payload["visit"], ctx.attempt))
        if payload["visit"] == 2:
            raise RuntimeError("gateway down")
        if payload["visit"] == 3 and calls.count((3, 1)) == 1:
            raise RetryLater(120, "flood wait")
        ctx.session.execute(insert(effects).values(what=f"sent {payload['visit']}"))

    with app_sessions.begin() as session:
        for visit in (1, 2, 3):
            record(session, "visit.paid", {"visit": visit})
    assert kit.deliver().done == 3
    assert [e.delivery("receipt").status for e in kit.recorded("visit.paid")] == ["done"] * 3
    assert kit.deliver().handled == 0  # nothing twice
    ran = kit.drain()
    assert (ran.done, ran.retried, ran.deferred) == (1, 1, 1)
    [retrying] = kit.dispatched(notify, visit=2)
    assert retrying.retrying and retrying.attempts == 1 and retrying.last_error == "RuntimeError: gateway down"
    assert retrying.available_at == T0 + timedelta(seconds=30)
    [later] = kit.dispatched(notify, visit=3)
    assert later.retrying and later.attempts == 0 and later.available_at == T0 + timedelta(seconds=120)  # attempt kept

    kit.clock.advance(seconds=29)
    assert kit.drain().handled == 0  # the backoff has not passed
    kit.clock.advance(seconds=1)
    assert kit.drain().retried == 1
    ran = kit.drain(until=timedelta(hours=1))
    assert ran.failed == 1 and ran.done == 1 and kit.clock.now == T0 + timedelta(hours=1, seconds=30)
    [failed] = kit.dispatched(notify, visit=2)
    assert failed.failed and failed.attempts == 3 and failed.last_error == "RuntimeError: gateway down"
    assert kit.dispatched(notify, visit=3)[0].done
    assert [call for call in calls if call[0] == 3] == [(3, 1), (3, 1)]  # the call after RetryLater: attempt 1
    assert written(runtime) == ["receipt 1", "receipt 2", "receipt 3", "sent 1", "sent 3"]


def test_deliver_one_type_leaves_the_others_and_loses_no_event_recorded_meanwhile(kit, registry, runtime):
    seen = []

    @consumer("visit.paid", name="paid", registry=registry)
    def paid(event, ctx):
        seen.append(("paid", event.payload))
        record(ctx.session, "visit.followed", {"by": "paid"})  # recorded during the one-type run

    consumer("visit.followed", name="followed", registry=registry)(lambda e, ctx: seen.append(("followed", e.payload)))
    consumer("visit.followed", name="audited", registry=registry)(lambda e, ctx: seen.append(("audited", e.payload)))
    with runtime.sessions.begin() as session:
        record(session, "visit.followed", {"by": "test"})
        record(session, "visit.paid", {"n": 1})
    assert kit.deliver("visit.paid").done == 1
    assert seen == [("paid", {"n": 1})]
    [first, _, followed] = kit.recorded()
    assert sorted((d.consumer, d.status) for d in first.deliveries) == [("audited", "pending"), ("followed", "pending")]
    assert sorted(d.consumer for d in followed.deliveries) == ["audited", "followed"]  # fanned out to all
    assert kit.deliver().done == 4
    assert sorted((name, payload["by"]) for name, payload in seen[1:]) == [
        ("audited", "paid"), ("audited", "test"), ("followed", "paid"), ("followed", "test")]
    with pytest.raises(KitError, match="no consumer registered in this app's runtime takes 'visit.unknown' events"):
        kit.deliver("visit.unknown")


def test_handlers_that_dispatch_each_other_without_end_are_named(runtime, registry):
    @job(name="ping", registry=registry)
    def ping(payload, ctx):
        pong.dispatch(ctx.session, payload)

    @job(name="pong", registry=registry)
    def pong(payload, ctx):
        ping.dispatch(ctx.session, payload)

    @consumer("echo", name="echo", registry=registry)
    def echo(event, ctx):
        record(ctx.session, "echo", {})

    with Kit(runtime, run_limit=20) as kit:
        with runtime.sessions.begin() as session:
            ping.dispatch(session, {})
            record(session, "echo", {})
        with pytest.raises(DrainLoop, match=r"drain\(\) ran 20 jobs and jobs are still due: .* Dispatched meanwhile: "
                                            r"pong x10, ping x10"):
            kit.drain()
        with pytest.raises(DrainLoop, match=r"deliver\(\) ran 20 consumers .* Recorded meanwhile: echo x20"):
            kit.deliver()


def test_bad_use_is_a_clear_error(kit, registry, runtime):
    with runtime.sessions.begin() as session:
        job(name="elsewhere", registry=registry)(lambda payload, ctx: None).dispatch(session, {})
    registry_without = Runtime(runtime.settings)  # the process's default registry: no "elsewhere" job there
    try:
        with Kit(registry_without) as other:
            with pytest.raises(KitError, match=r"jobs are due that no job registered in this app's runtime can run: "
                                               r"elsewhere on default \(1\)"):
                other.drain()
            with pytest.raises(KitError, match="no job registered in this app's runtime runs on queue 'nowhere'"):
                other.drain("nowhere")
            with pytest.raises(KitError, match="no job 'elsewhere' is registered"):
                other.perform("elsewhere", {})
    finally:
        registry_without.dispose()
    with pytest.raises(KitError, match="already started"):
        kit.start()
    with pytest.raises(KitError, match=r"the clock only moves forward"):
        kit.clock.advance(seconds=-1)
    with pytest.raises(KitError, match="in the past"):
        kit.drain(until=T0 - timedelta(days=1))
    with pytest.raises(KitError, match="takes a Flask app set up with Cronbox"):
        Kit(object())


@pytest.fixture
def unmigrated(settings, registry, database):
    rt = Runtime(settings, registry=registry)  # the test's database as it was created: empty
    yield rt
    rt.dispose()


def test_an_unmigrated_database_is_refused_until_migrated(unmigrated):
    with Kit(unmigrated) as kit:
        with pytest.raises(KitError, match=r"the test database has no cronbox tables; this cronbox needs \S+: "
                                           r"migrate it first"):
            kit.assert_recorded("anything")
        with pytest.raises(KitError, match="has no cronbox tables"):
            kit.drain()
        kit.migrate()
        kit.refute_recorded("anything")


def test_every_time_dependent_feature_reads_the_test_clock(kit, registry, runtime):
    """delay=, retry_until, leases, rate limits and periodic task slots (backoff: above)."""
    ran = []
    later = job(name="later", registry=registry)(lambda payload, ctx: ran.append(("later", payload)))
    limited = job("limited", name="limited", rate_limit="1/m", registry=registry)(
        lambda payload, ctx: ran.append(("limited", payload)))

    @job(name="polling", retry_until=timedelta(minutes=10), registry=registry)
    def polling(payload, ctx):
        raise RetryLater(240, "not ready")

    leased = job("leased", name="leased", timeout=60, registry=registry)(
        lambda payload, ctx: ran.append(("leased", ctx.attempt)))
    daily = schedule.cron("0 3 * * *", name="daily", registry=registry)(lambda ctx: ran.append(("daily", ctx.slot)))

    with runtime.sessions.begin() as session:
        later.dispatch(session, 1, delay=timedelta(minutes=5))
        limited.dispatch(session, 1)
        limited.dispatch(session, 2)
        polling.dispatch(session, {})
        leased.dispatch(session, {})
    # A worker that claimed "leased" and died: its lease (timeout 60 s + margin 0) holds it until then.
    with runtime.sessions.begin() as session:
        jobstore.claim_due(session, registry.jobs, "leased", now=T0, limit=1, mode=runtime.claim_mode(), lease_margin=0)
    kit.drain()
    waiting = kit.dispatched(limited)[1]
    assert ran == [("limited", 1)] and waiting.retrying and waiting.available_at == T0 + timedelta(seconds=60)
    kit.clock.advance(seconds=60)
    kit.drain()
    assert ran[1:] == [("limited", 2), ("leased", 2)]  # the next minute's window opened; the lease ran out
    kit.drain(until=timedelta(minutes=15))
    assert ran[3:] == [("later", 1)]
    [polled] = kit.dispatched(polling)
    assert polled.failed and "retry_until has passed" in polled.last_error

    kit.clock.set(datetime(2026, 12, 2, 3, 0, 30))
    kit.tick()
    kit.tick()
    kit.clock.advance(hours=23, minutes=59)
    kit.tick()
    kit.clock.advance(minutes=1)
    kit.tick()
    assert ran[4:] == [("daily", datetime(2026, 12, 2, 3, 0)), ("daily", datetime(2026, 12, 3, 3, 0))]
    assert daily.task_name == "daily"


def test_perform_calls_one_job_with_a_real_context(kit, registry, runtime):
    @job(name="write", registry=registry)
    def write(payload, ctx):
        ctx.session.execute(insert(effects).values(what=payload["what"]))
        if payload.get("fail"):
            raise RuntimeError("declined")
        if payload.get("later"):
            raise RetryLater(30, "busy")
        return None

    done = kit.perform(write, {"what": "kept"})
    assert done.ok and done.error is None
    failed = kit.perform("write", {"what": "gone", "fail": True})
    assert (failed.kind, failed.error) == ("error", "RuntimeError: declined")
    deferred = kit.perform(write, {"what": "also gone", "later": True})
    assert (deferred.kind, deferred.retry_in, deferred.error) == ("retry-later", 30.0, "RetryLater: busy (in 30s)")
    assert written(runtime) == ["kept"]
    assert kit.dispatched() == []  # no job row
    with pytest.raises(Exception, match=r"payload\['at'\] is a datetime"):
        kit.perform(write, {"at": datetime.now()})


def test_the_test_driver_captures_each_channel_and_can_refuse(kit, registry, runtime):
    for channel_job in (send_sms, send_email, send_webhook):
        registry.jobs.add(channel_job.job)
    with runtime.sessions.begin() as session:
        send_sms.dispatch(session, {"to": "+989121234567", "text": "Your receipt R-1"})
        send_email.dispatch(session, {"to": "sara@example.org", "subject": "Receipt", "text": "Dear Sara"})
        send_webhook.dispatch(session, {"check": "c", "status": "fail", "message": "m", "time": "t", "host": "h",
                                        "recovery": False})
    kit.outbox.refuse("sms", reason="gateway down")
    assert kit.drain().retried == 1
    [sms] = kit.dispatched(send_sms)
    assert sms.retrying and sms.last_error == "SendFailed: gateway down"
    assert [(m.channel, m.to) for m in kit.outbox.messages] == [
        ("mail", "sara@example.org"), ("webhook", "https://alerts.example")]
    assert kit.outbox.mail[0].subject == "Receipt" and '"status":"fail"' in kit.outbox.webhooks[0].text
    kit.drain(until=timedelta(minutes=2))
    [text] = kit.outbox.sms
    assert (text.to, text.text, text.sent_at) == ("+989121234567", "Your receipt R-1", kit.dispatched(send_sms)[0].finished_at)
    assert [m.text for m in kit.outbox.to("+989121234567")] == ["Your receipt R-1"]
    kit.outbox.clear()
    assert kit.outbox.messages == []


def test_a_channel_without_the_test_driver_is_not_read_as_empty(runtime, registry, env):
    from cronbox.outbox.core.settings import load_settings

    rt = Runtime(load_settings(environ={**env, "CRONBOX_SMS_DRIVER": "log"}), registry=registry)
    try:
        with Kit(rt) as kit:
            with pytest.raises(KitError, match="the sms channel does not use the test driver.*CRONBOX_SMS_DRIVER=test"):
                kit.outbox.of("sms")
            with pytest.raises(KitError, match="the sms channel does not use the test driver"):
                kit.outbox.refuse("sms")
    finally:
        rt.dispose()
    from cronbox.outbox.channels.config import channel_config
    from cronbox.outbox.core.errors import SettingsError

    with pytest.raises(SettingsError, match="CRONBOX_WEBHOOK_DRIVER='pigeon' is not one of http, test"):
        channel_config(load_settings(environ={**env, "CRONBOX_WEBHOOK_DRIVER": "pigeon"}))


def test_inline_mode_runs_what_a_commit_wrote_and_refuses_an_unwatched_session(kit, registry, runtime,
                                                                               app_sessions):
    seen = []

    @consumer("visit.paid", name="receipt", registry=registry)
    def receipt(event, ctx):
        seen.append(("receipt", event.payload["visit"]))
        thanks.dispatch(ctx.session, event.payload, delay=60)

    thanks = job(name="thanks", registry=registry)(lambda payload, ctx: seen.append(("thanks", payload["visit"])))
    with kit.inline(app_sessions):
        with app_sessions() as session:
            record(session, "visit.paid", {"visit": 1})
            session.rollback()
            assert seen == []
            record(session, "visit.paid", {"visit": 2})
            session.commit()
            assert seen == [("receipt", 2)]  # right after the commit, in this process
        kit.clock.advance(seconds=60)
        assert seen == [("receipt", 2), ("thanks", 2)]  # what came due ran when the clock moved
        assert kit.mode == "inline"
    assert kit.mode == "manual"

    with pytest.raises(KitError, match="1 event.* committed and never ran: they were written through a session "
                                       "inline mode does not watch"):
        with kit.inline(app_sessions):
            with runtime.sessions.begin() as session:  # not the watched sessions
                record(session, "visit.paid", {"visit": 3})
            kit.recorded()
    other = sessionmaker(create_engine("sqlite://"))
    with pytest.raises(KitError, match="the session given writes to sqlite://, but cronbox runs on"):
        with kit.inline(other):
            pass
    with pytest.raises(KitError, match="inline mode needs the session the app writes through"):
        with kit.inline():
            pass


@pytest.mark.backends("sqlite")
def test_a_named_in_memory_sqlite_database_shared_by_the_app_and_cronbox(registry, tmp_path):
    """A private in-memory database (sqlite://) is one connection's alone; a named one with a shared cache
    is the whole process's: the app's engine and cronbox's meet in it."""
    from cronbox.outbox.core.settings import load_settings

    url = f"sqlite:///file:kit-{tmp_path.name}?mode=memory&cache=shared&uri=true"
    app_engine = create_engine(url, poolclass=QueuePool)
    app_sessions = sessionmaker(app_engine)
    keep_alive = app_engine.connect()  # the database lives while a connection to it does
    consumer("visit.paid", name="receipt", registry=registry)(lambda event, ctx: ctx.session.execute(
        insert(effects).values(what="receipt")))
    rt = Runtime(load_settings(environ={"DATABASE_URL": url, "CRONBOX_INSTANCE": str(tmp_path / "instance"),
                                        "CRONBOX_HANDLERS": ""}), registry=registry)
    try:
        with Kit(rt, mode="inline", session=app_sessions) as kit:
            kit.migrate()
            effects_meta.create_all(app_engine)
            with app_sessions.begin() as session:
                record(session, "visit.paid", {"visit": 1})
            assert kit.recorded("visit.paid")[0].delivery("receipt").status == "done"
            with app_engine.connect() as connection:
                assert connection.scalar(select(func.count()).select_from(effects)) == 1
    finally:
        rt.dispose()
        keep_alive.close()
        app_engine.dispose()


def test_batches_and_chains_drain_and_the_batch_helpers_read_them(kit, runtime, registry):
    """docs/testing.md's batch example, run with this test's registry: drain() runs members, then the
    callback their last outcome dispatched, and chain steps one after another; batch() and
    assert_batch_finished() read the progress, the latter failing with the members still waiting."""
    import cronbox
    from cronbox import PermanentFailure
    from tests.docs_snippets import snippet

    @job("sms", name="kit.remind", tries=1, registry=registry)
    def remind(payload, ctx):
        if payload == "+1000":
            raise PermanentFailure("no such number")
        return {"reached": payload}

    @job("mail", name="kit.desk_summary", registry=registry)
    def desk_summary(payload, ctx):
        reached = [value["reached"] for _id, value in ctx.batch.results(ctx.session)]
        ctx.session.execute(insert(effects).values(what=f"summary {payload}: {len(reached)} reached"))

    def send_reminders(session, day, phones):
        batch = cronbox.batch(session, name=f"reminders {day}", then=desk_summary, allow_failures=True, payload=day)
        for phone in phones:
            remind.dispatch(session, phone, batch=batch)
        return batch

    namespace = {}
    exec(compile(snippet("docs/testing.md", "assert_batch_finished(reminders)"), "docs/testing.md", "exec"),
         namespace)
    with runtime.sessions() as session:
        namespace["test_the_front_desk_gets_one_summary_after_the_reminders"](kit, send_reminders, desk_summary,
                                                                               session)
    assert written(runtime) == ["summary 2026-12-07: 2 reached"]

    with runtime.sessions.begin() as session:
        waiting = send_reminders(session, "2026-12-08", ["+15550003"])
        empty = cronbox.batch(session, name="nobody", then=desk_summary, payload="none")
    assert kit.batch(waiting.id).pending == 1 and kit.batch(empty).state == "finished"
    with pytest.raises(AssertionError) as failed:
        kit.assert_batch_finished(waiting)
    assert f"batch {waiting.id} 'reminders 2026-12-08' is running" in str(failed.value)
    assert "kit.remind (ready, attempts 0)" in str(failed.value)
    with pytest.raises(KitError, match="no batch 987654"):
        kit.batch(987654)

    @job("q", name="kit.step", registry=registry)
    def step(payload, ctx):
        return (ctx.previous or 0) + payload

    @job("q", name="kit.last", registry=registry)
    def last(payload, ctx):
        ctx.session.execute(insert(effects).values(what=f"chain {ctx.previous + payload}"))

    with runtime.sessions.begin() as session:
        cronbox.chain(session, [(step, 1), (step, 10), (last, 100)])
    assert kit.drain().done == 6  # the second batch's member and the empty one's then, the chain's three steps
    assert "chain 111" in written(runtime) and "summary none: 0 reached" in written(runtime)
    assert kit.assert_batch_finished(waiting).done == 1
