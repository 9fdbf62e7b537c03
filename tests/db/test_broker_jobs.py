"""Jobs of a queue forwarded to the real RabbitMQ (cronbox.forward_jobs), in-process, on every backend:
the tick's publisher (confirms, the lease, publishing again under the same claim), the broker worker
(the row's token decides: stale copies and duplicates run never or once), retries, RetryLater,
PermanentFailure, the failed list and `queue retry`, a redelivered job's attempt, a handler the
worker lacks, and the broker unreachable for a while."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from datetime import timedelta

import amqp
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import OperationalError, PendingRollbackError

import cronbox
from cronbox.cron.scheduling import metrics
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.amqp import broker_loop
from cronbox.outbox.amqp.broker import parse_url
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.broker_worker import BrokerWorker
from cronbox.outbox.queue import celery_messages, pauses
from cronbox.outbox.queue.forward_jobs import celery_task, forward_jobs
from cronbox.outbox.queue.models import Job
from cronbox.outbox.queue.publisher import JobPublisher
from cronbox.outbox.queue.worker import Worker
from tests.handlers.consuming import consumed, metadata as consumed_metadata
from tests.broker_rows import publish_jobs as publish
from tests.console_helpers import logged_in, make_app
from tests.rabbit import HOST, url

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "mysql-token", "postgresql")

J = Job.__table__


class Forwarded:
    def __init__(self, declared, calls):
        self.declared, self.calls, self.broker_queue = declared, calls, declared.broker_queue


@pytest.fixture
def forwarded(runtime, registry, rabbit):
    """Queue "sms" forwarded to a broker queue of this test; two jobs on it, one on a queue the tick runs."""
    consumed_metadata.create_all(runtime.engine)
    runtime.settings.raw["CRONBOX_AMQP_URL"] = rabbit.url
    calls: list[tuple[int, int]] = []

    @cronbox.job("sms", name="send", tries=3, backoff=[0.3, 0.3], timeout=10, registry=registry)
    def send(payload, ctx):
        calls.append((payload["n"], ctx.attempt))
        ctx.session.execute(consumed.insert().values(consumer="send", n=payload["n"], attempt=ctx.attempt))
        if payload.get("permanent_until_flag") and not runtime.settings.raw.get("TEST_FIXED"):
            raise cronbox.PermanentFailure("the number is not a phone")
        if ctx.attempt <= payload.get("fail", 0):
            raise RuntimeError(f"gateway down on attempt {ctx.attempt}")
        if sum(n == payload["n"] for n, _attempt in calls) <= payload.get("later", 0):  # its first "later" calls
            raise cronbox.RetryLater(0.2, "gateway says later")
        time.sleep(payload.get("sleep", 0))

    @cronbox.job("sms", name="paused", channel="gateway", registry=registry)
    def paused(payload, ctx):
        ctx.session.execute(consumed.insert().values(consumer="paused", n=payload["n"], attempt=ctx.attempt))

    @cronbox.job("local", name="local", registry=registry)
    def local(payload, ctx):
        ctx.session.execute(consumed.insert().values(consumer="local", n=payload["n"], attempt=ctx.attempt))

    declared = forward_jobs("sms", broker_queue=rabbit.name("jobs.sms"), republish_after=60, registry=registry)
    rabbit.queues.append(declared.broker_queue)
    return Forwarded(declared, calls)


def dispatch(runtime, registry, handler, payloads, *, rollback=False) -> list[int]:
    job = registry.jobs.get(handler)
    with runtime.sessions() as session:
        ids = [job.dispatch(session, p) for p in payloads]
        (session.rollback if rollback else session.commit)()
    return ids


def run_until_done(runtime, rabbit, forwarded, job_id: int, seconds: float = 90):
    """Ticks' publishes and broker workers' runs until the job is done (its retries wait their backoff);
    `seconds` only bounds a run that never gets there, so it is far above what a loaded machine takes."""
    deadline = time.monotonic() + seconds
    while job_rows(runtime, [job_id])[job_id].status != "done" and time.monotonic() < deadline:
        publish(runtime)
        work(runtime, rabbit, forwarded)
        time.sleep(0.1)
    return job_rows(runtime, [job_id])[job_id]


def work(runtime, rabbit, forwarded, **budget) -> BrokerWorker:
    worker = BrokerWorker(runtime, parse_url(rabbit.url), [forwarded.declared], stop_when_empty=True)
    result = worker.work(Budget(max_time=budget.pop("max_time", 30), memory_mb=None, **budget))
    assert result.exit_code == 0, result
    return worker


def effects(runtime) -> list[tuple[str, int, int]]:
    with runtime.sessions() as session:
        return [tuple(r) for r in session.execute(select(consumed.c.consumer, consumed.c.n, consumed.c.attempt)
                                                  .order_by(consumed.c.id))]


def job_rows(runtime, ids):
    with runtime.sessions() as session:
        return {r.id: r for r in session.execute(select(J).where(J.c.id.in_(ids)))}


def statuses(runtime) -> dict:
    with runtime.sessions() as session:
        return dict(session.execute(select(J.c.status, func.count()).group_by(J.c.status)).all())


def waiting(rabbit, queue) -> int:
    return rabbit.channel.queue_declare(queue, passive=True).message_count


def test_committed_jobs_run_once_off_the_broker_rolled_back_ones_never(runtime, registry, rabbit, forwarded):
    ids = dispatch(runtime, registry, "send", [{"n": n} for n in range(5)])
    dispatch(runtime, registry, "send", [{"n": 99}], rollback=True)
    dispatch(runtime, registry, "local", [{"n": 7}])
    assert runtime.default_queues() == ["local"]  # the tick's worker leaves "sms" to the broker
    assert Worker(runtime).run(Budget(max_time=10, memory_mb=None)) == 1

    publisher = publish(runtime)
    assert (publisher.stats.published, publisher.stats.failed) == (5, 0)
    assert waiting(rabbit, forwarded.broker_queue) == 5
    rows = job_rows(runtime, ids)
    # On the broker: reserved under the publish's claim, no attempt counted until a worker takes it.
    assert {r.status for r in rows.values()} == {"reserved"} and {r.attempts for r in rows.values()} == {0}
    # Leased for republish_after once confirmed: a second pass publishes nothing.
    assert min(r.available_at for r in rows.values()) > clock.utcnow() + timedelta(seconds=50)
    assert publish(runtime).stats.published == 0

    worker = work(runtime, rabbit, forwarded)
    assert worker.stats.done == 5 and worker.broker_stats.stale == 0
    assert sorted(effects(runtime)) == sorted([("local", 7, 1)] + [("send", n, 1) for n in range(5)])
    assert {r.status for r in job_rows(runtime, ids).values()} == {"done"}
    assert waiting(rabbit, forwarded.broker_queue) == 0


def test_duplicate_stale_and_foreign_copies_never_run_twice(runtime, registry, rabbit, forwarded):
    [job_id] = dispatch(runtime, registry, "send", [{"n": 1}])
    publish(runtime)
    token = job_rows(runtime, [job_id])[job_id].claim_token
    for body in (json.dumps({"job": job_id, "claim_token": token}),  # the same claim twice (a publisher crash)
                 json.dumps({"job": job_id, "claim_token": "0" * 32}),  # a claim that is not the row's
                 json.dumps({"job": 10 ** 9, "claim_token": token}),  # no such job
                 "not json", json.dumps({"job": "1; DROP", "claim_token": token})):
        rabbit.channel.basic_publish(amqp.Message(body), exchange="", routing_key=forwarded.broker_queue)
    worker = work(runtime, rabbit, forwarded)
    assert effects(runtime) == [("send", 1, 1)]
    assert (worker.stats.done, worker.broker_stats.stale, worker.broker_stats.bad) == (1, 3, 2)
    assert job_rows(runtime, [job_id])[job_id].status == "done"


SECRET = "PAYLOAD-SECRET-7731"  # in every payload: never in a log line


def refusal_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and r.getMessage().startswith("amqp work:") and " refused: " in r.getMessage()]


def test_a_message_runs_only_its_own_job_of_its_own_queue_and_each_refused_copy_is_one_warning(
        runtime, registry, rabbit, forwarded, caplog):
    """Issue 35 (3, 9): a job message is a claim on one job of one queue. On the sms worker's broker
    queue: a report job's message, a real sms job's id with the token of another job of the same
    publish, the copy of a job already done, a forged id. Each is refused: its job untouched, one
    WARNING line with the message id and the reason (no token, no payload); the right worker runs
    every job exactly once."""
    caplog.set_level("INFO", logger="cronbox")

    @cronbox.job("report", name="report", registry=registry)  # registered in the sms worker too: same code
    def report(payload, ctx):
        ctx.session.execute(consumed.insert().values(consumer="report", n=payload["n"], attempt=ctx.attempt))

    reports = forward_jobs("report", broker_queue=rabbit.name("jobs.report"), republish_after=60, registry=registry)
    rabbit.queues.append(reports.broker_queue)
    [done_id] = dispatch(runtime, registry, "send", [{"n": 0, "secret": SECRET}])
    publish(runtime)
    [done_copy] = rabbit.take(forwarded.broker_queue)
    rabbit.channel.basic_publish(done_copy, exchange="", routing_key=forwarded.broker_queue)
    work(runtime, rabbit, forwarded)
    assert job_rows(runtime, [done_id])[done_id].status == "done"

    ids = dispatch(runtime, registry, "send", [{"n": 1, "secret": SECRET}, {"n": 2, "secret": SECRET}])
    [report_id] = dispatch(runtime, registry, "report", [{"n": 3, "secret": SECRET}])
    publish(runtime)
    sms_messages = rabbit.take(forwarded.broker_queue)
    [report_message] = rabbit.take(reports.broker_queue)
    tokens = {json.loads(m.body)["job"]: json.loads(m.body)["claim_token"]
              for m in [*sms_messages, report_message, done_copy]}
    refused = [  # (body, message id, what its WARNING line says)
        (report_message.body, report_message.properties["message_id"], "queue report"),
        (json.dumps({"job": ids[0], "claim_token": tokens[ids[1]]}), "forged-other-token", "claim token"),
        (done_copy.body, done_copy.properties["message_id"], "done"),
        (json.dumps({"job": 10 ** 9, "claim_token": tokens[ids[0]]}), "forged-id", "no such job"),
    ]
    for body, message_id, _why in refused:  # ahead of the real ones: read and taken in one batch with them
        rabbit.channel.basic_publish(amqp.Message(body, message_id=message_id), exchange="",
                                     routing_key=forwarded.broker_queue)
    for message in sms_messages:
        rabbit.channel.basic_publish(message, exchange="", routing_key=forwarded.broker_queue)
    before = job_rows(runtime, [report_id])[report_id]
    caplog.clear()
    worker = work(runtime, rabbit, forwarded)
    assert worker.stats.done == 2 and worker.broker_stats.stale == 4
    after = job_rows(runtime, [report_id])[report_id]
    assert (after.status, after.claim_token, after.attempts, after.available_at, after.reserved_at) == \
           (before.status, before.claim_token, before.attempts, before.available_at, before.reserved_at)
    lines = refusal_lines(caplog)
    assert len(lines) == len(refused), lines
    for (_body, message_id, why), line in zip(refused, lines):
        assert f"message={message_id} " in line and why in line, line

    rabbit.channel.basic_publish(report_message, exchange="", routing_key=reports.broker_queue)
    report_worker = BrokerWorker(runtime, parse_url(rabbit.url), [reports], stop_when_empty=True)
    assert report_worker.work(Budget(max_time=30, memory_mb=None)).exit_code == 0
    assert sorted(effects(runtime)) == [("report", 3, 1), ("send", 0, 1), ("send", 1, 1), ("send", 2, 1)]
    assert {r.status for r in job_rows(runtime, [done_id, *ids, report_id]).values()} == {"done"}
    for token in tokens.values():
        assert token not in caplog.text
    assert SECRET not in caplog.text


@pytest.mark.backends("sqlite")  # how many lines a flood costs does not depend on the database
def test_a_flood_of_forged_messages_costs_a_bounded_number_of_log_lines_and_a_count(runtime, registry, rabbit,
                                                                                  forwarded, caplog):
    caplog.set_level("INFO", logger="cronbox")
    flood = 60
    rabbit.channel.queue_declare(forwarded.broker_queue, durable=True, auto_delete=False)  # as a publish would
    for n in range(flood):
        body = json.dumps({"job": 10 ** 9 + n, "claim_token": "f" * 32}) if n % 3 else "not a job"
        rabbit.channel.basic_publish(amqp.Message(body, message_id=f"forged-{n}"), exchange="",
                                     routing_key=forwarded.broker_queue)
    worker = work(runtime, rabbit, forwarded)
    assert worker.broker_stats.stale + worker.broker_stats.bad == flood
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    one_each = [w for w in warnings if " refused: " in w or " dropped: " in w]
    summaries = [w for w in warnings if "more not logged" in w]
    # A minute's window: a slow run may open a second one, never more lines than that.
    assert 1 <= len(one_each) <= 2 * 10 and summaries, warnings
    left_out = sum(int(w.split(" more not logged")[0].rsplit(" ", 1)[1]) for w in summaries)
    assert len(one_each) + left_out == flood, warnings


def test_retries_wait_their_backoff_and_are_published_again(runtime, registry, rabbit, forwarded):
    [job_id] = dispatch(runtime, registry, "send", [{"n": 1, "fail": 2}])
    row = run_until_done(runtime, rabbit, forwarded, job_id)
    assert row.status == "done" and row.attempts == 3 and row.last_error is None
    assert forwarded.calls == [(1, 1), (1, 2), (1, 3)]
    assert effects(runtime) == [("send", 1, 3)]  # the failed attempts' writes rolled back


def test_retry_later_uses_no_attempt(runtime, registry, rabbit, forwarded):
    [job_id] = dispatch(runtime, registry, "send", [{"n": 1, "later": 2}])  # "later" twice, then done
    row = run_until_done(runtime, rabbit, forwarded, job_id)
    assert row.status == "done" and row.attempts == 1
    assert forwarded.calls == [(1, 1), (1, 1), (1, 1)]


def test_permanent_failure_is_failed_where_operators_look_and_the_console_retry_sends_it_back(runtime, registry,
                                                                                              rabbit, forwarded, env):
    [job_id] = dispatch(runtime, registry, "send", [{"n": 1, "permanent_until_flag": 1}])
    publish(runtime)
    work(runtime, rabbit, forwarded)
    row = job_rows(runtime, [job_id])[job_id]
    assert row.status == "failed" and "the number is not a phone" in row.last_error
    text = metrics.render(metrics.collect(runtime))  # /metrics, as the database worker's failures show
    assert 'cronbox_jobs{queue="sms",state="failed"} 1' in text
    assert runtime.listed_queues() == ["local", "sms"]  # queue status and the console list it, even empty
    with runtime.sessions() as session:  # `queue failed` and the console's failed list read this page
        assert [r.id for r in jobstore.failed_page(session, queue="sms").rows] == [job_id]
    app = make_app(env, runtime)
    try:
        operator = logged_in(app)
        response = operator.post("/ops/queues/retry", {"id": str(job_id)})
        assert response.status_code == 303 and job_rows(runtime, [job_id])[job_id].status == "ready"
    finally:
        app.extensions["cronbox"].runtime.dispose()
    runtime.settings.raw["TEST_FIXED"] = "1"
    assert publish(runtime).stats.published == 1  # back the way it came: to the broker
    work(runtime, rabbit, forwarded)
    row = job_rows(runtime, [job_id])[job_id]
    assert row.status == "done" and row.attempts == 1 and row.last_error is None


def test_only_one_copy_takes_a_job_and_the_take_counts_its_attempt(runtime, registry, rabbit, forwarded):
    ids = dispatch(runtime, registry, "send", [{"n": 1}, {"n": 2}])
    publish(runtime)
    # What a worker reads: the id and the job's own token, nothing of the payload; the message id names
    # the claim without its token.
    message = rabbit.channel.basic_get(forwarded.broker_queue, no_ack=True)
    tokens = [job_rows(runtime, ids)[job_id].claim_token for job_id in ids]
    assert tokens[0] != tokens[1]  # one publish, a token per job
    assert json.loads(message.body) == {"job": ids[0], "claim_token": tokens[0]}
    digest = hashlib.sha256(tokens[0].encode()).hexdigest()[:16]
    assert message.properties["delivery_mode"] == 2 and message.properties["message_id"] == f"cronbox-job-{ids[0]}-{digest}"
    assert message.properties["application_headers"]["x-cronbox-handler"] == "send"
    rabbit.channel.queue_purge(forwarded.broker_queue)
    # A copy of the first message came twice; the second job is named with the first's token, then with its own.
    named = [(ids[0], tokens[0]), (ids[0], tokens[0]), (ids[1], tokens[0]), (ids[1], tokens[1])]
    now = clock.utcnow()
    with runtime.sessions() as session:
        took = jobstore.take(session, registry.jobs, ["sms"], named, now=now, lease_margin=5)
        session.commit()
    taken = took.taken
    assert [item.id for item in taken] == ids and took.not_here == [] and took.taken_by == {ids[0]: 0, ids[1]: 3}
    assert took.refused == {1: jobstore.COPY_IN_BATCH, 2: jobstore.TOKEN_NOT_THE_JOBS}
    assert {item.attempts for item in taken} == {1} and taken[0].claim_token not in tokens
    assert taken[0].lease_until == now + timedelta(seconds=10 + 5)  # the handler's timeout + margin, as a claim's
    rows = job_rows(runtime, ids)  # what the take returned is what it wrote
    assert [(rows[i].claim_token, rows[i].attempts, rows[i].available_at, rows[i].reserved_at) for i in ids] == \
           [(item.claim_token, item.attempts, item.lease_until, now) for item in taken]
    with runtime.sessions() as session:  # a later copy, or one racing it: the token it carries is gone
        again = jobstore.take(session, registry.jobs, ["sms"], named, now=now, lease_margin=5)
        session.commit()
    assert (again.taken, again.not_here) == ([], []) and set(again.refused.values()) == {jobstore.TOKEN_NOT_THE_JOBS}
    # The taker died: once the lease ends the publisher sends them again under the taker's token,
    # flagged, and the next worker takes each alone; the attempt the dead one used stays used.
    with runtime.sessions() as session:
        session.execute(update(J).where(J.c.id.in_(ids)).values(available_at=clock.utcnow() - timedelta(seconds=1)))
        session.commit()
    assert publish(runtime).stats.republished == 2
    copies = rabbit.take(forwarded.broker_queue)
    assert [m.properties["application_headers"].get("x-cronbox-again") for m in copies] == [True, True]
    # Sent again under a new claim: the worker that took them (were it only slow) can neither extend
    # their lease nor ack them now, so it never runs one beside the worker that takes the copy.
    assert {json.loads(m.body)["claim_token"] for m in copies} & {item.claim_token for item in taken} == set()
    with runtime.sessions() as session:
        assert not jobstore.extend(session, taken[0], clock.utcnow() + timedelta(seconds=60))
    for copy in copies:
        rabbit.channel.basic_publish(copy, exchange="", routing_key=forwarded.broker_queue)
    worker = work(runtime, rabbit, forwarded)
    rows = job_rows(runtime, ids)
    assert {r.status for r in rows.values()} == {"done"} and {r.attempts for r in rows.values()} == {2}
    assert sorted(effects(runtime)) == [("send", 1, 2), ("send", 2, 2)] and worker.stats.done == 2


def test_a_job_on_its_last_try_whose_taker_died_fails_without_running_again(runtime, registry, rabbit, forwarded):
    [job_id] = dispatch(runtime, registry, "send", [{"n": 1}])
    publish(runtime)
    token = job_rows(runtime, [job_id])[job_id].claim_token
    with runtime.sessions() as session:  # taken three times by workers that died (tries=3)
        for _ in range(3):
            [item] = jobstore.take(session, registry.jobs, ["sms"], [(job_id, token)], now=clock.utcnow(),
                                   lease_margin=5).taken
            token = item.claim_token
        session.execute(update(J).where(J.c.id == job_id).values(available_at=clock.utcnow() - timedelta(seconds=1)))
        session.commit()
    publish(runtime)
    worker = work(runtime, rabbit, forwarded)
    row = job_rows(runtime, [job_id])[job_id]
    assert row.status == "failed" and worker.stats.gave_up == 1
    # the three takes that died, not the fourth that gave it up without running (issue 35)
    assert row.attempts == 3 and row.last_error.startswith("gave up: attempt 3 of 3 was claimed but never finished")
    assert effects(runtime) == []


def test_moving_a_queue_back_to_the_tick_runs_what_was_left_on_the_broker_once(runtime, registry, rabbit, forwarded):
    ids = dispatch(runtime, registry, "send", [{"n": 1}, {"n": 2}])
    publish(runtime)
    rabbit.channel.queue_purge(forwarded.broker_queue)  # no broker worker left to run them
    back = Registry()  # the app deployed without forward_jobs("sms")
    back.jobs.add(registry.jobs.get("send"))
    runtime.registry, mine = back, runtime.registry
    try:
        assert runtime.default_queues() == ["sms"]
        with runtime.sessions() as session:  # their lease (republish_after) runs out
            session.execute(update(J).where(J.c.id.in_(ids)).values(available_at=clock.utcnow() - timedelta(seconds=1)))
            session.commit()
        Worker(runtime).run(Budget(max_time=30, memory_mb=None))
    finally:
        runtime.registry = mine
    rows = job_rows(runtime, ids)
    assert {r.status for r in rows.values()} == {"done"} and {r.attempts for r in rows.values()} == {1}
    assert sorted(effects(runtime)) == [("send", 1, 1), ("send", 2, 1)]


def test_a_job_whose_lease_ran_out_is_published_again_under_the_same_claim(runtime, registry, rabbit, forwarded):
    ids = dispatch(runtime, registry, "send", [{"n": 1}, {"n": 2}])
    publish(runtime)
    before = job_rows(runtime, ids)
    rabbit.channel.queue_purge(forwarded.broker_queue)  # the messages lost on the broker
    with runtime.sessions() as session:  # republish_after has passed
        session.execute(update(J).where(J.c.id == ids[0]).values(available_at=clock.utcnow() - timedelta(seconds=1)))
        session.commit()
    publisher = publish(runtime)
    assert (publisher.stats.published, publisher.stats.republished) == (0, 1)
    after = job_rows(runtime, ids)
    assert after[ids[0]].claim_token == before[ids[0]].claim_token and after[ids[0]].attempts == 0
    work(runtime, rabbit, forwarded)
    assert effects(runtime) == [("send", 1, 1)]
    assert job_rows(runtime, ids)[ids[1]].status == "reserved"  # its lease holds: left to its message


def test_the_broker_unreachable_delays_jobs_and_loses_none(runtime, registry, rabbit, forwarded):
    ids = dispatch(runtime, registry, "send", [{"n": n} for n in range(3)])
    publisher = publish(runtime, url(rabbit.vhost, port=1))  # nothing listens there
    assert (publisher.stats.published, publisher.stats.failed) == (0, 3)
    rows = job_rows(runtime, ids)
    assert {r.status for r in rows.values()} == {"reserved"} and {r.attempts for r in rows.values()} == {0}
    assert publish(runtime, rabbit.url).stats.published == 0  # waiting PUBLISH_RETRY, not hammering
    with runtime.sessions() as session:
        session.execute(update(J).where(J.c.id.in_(ids)).values(available_at=clock.utcnow()))
        session.commit()
    publisher = publish(runtime, rabbit.url)
    assert publisher.stats.republished == 3
    work(runtime, rabbit, forwarded)
    assert sorted(effects(runtime)) == [("send", n, 1) for n in range(3)]  # one attempt each: the publish failures cost none


def test_a_broker_outage_ends_the_publishers_pass_after_one_failed_batch(runtime, registry, rabbit, forwarded):
    dispatch(runtime, registry, "send", [{"n": n} for n in range(7)])
    runtime.settings.raw["CRONBOX_AMQP_URL"] = url(rabbit.vhost, port=1)
    publisher = JobPublisher(runtime, batch_size=2)
    publisher.run(Budget(max_time=30, memory_mb=None))
    publisher.close()
    assert (publisher.stats.published, publisher.stats.failed) == (0, 2)  # the tick goes on with its other stages
    assert statuses(runtime) == {"reserved": 2, "ready": 5}


def test_a_broker_queue_declared_with_other_arguments_is_used_as_it_is(runtime, registry, rabbit, forwarded):
    rabbit.channel.queue_delete(forwarded.broker_queue)
    rabbit.channel.queue_declare(forwarded.broker_queue, durable=True, auto_delete=False,
                                 arguments={"x-max-priority": 10})  # the user's own declaration
    [job_id] = dispatch(runtime, registry, "send", [{"n": 1}])
    assert publish(runtime).stats.published == 1
    work(runtime, rabbit, forwarded)
    assert job_rows(runtime, [job_id])[job_id].status == "done"


def test_a_paused_channel_holds_a_broker_workers_job_without_an_attempt(runtime, registry, rabbit, forwarded):
    [job_id] = dispatch(runtime, registry, "paused", [{"n": 1}])
    with runtime.sessions() as session:
        pauses.pause(session, "gateway", 600, "out of credit", clock.utcnow())
        session.commit()
    publish(runtime)
    work(runtime, rabbit, forwarded)
    row = job_rows(runtime, [job_id])[job_id]
    assert row.status == "ready" and row.attempts == 0 and row.available_at > clock.utcnow() + timedelta(seconds=500)
    assert effects(runtime) == []


def test_a_job_whose_handler_the_worker_lacks_waits_without_an_attempt(runtime, registry, rabbit, forwarded, caplog):
    """Its outcome is written, counted and logged as every other (Outcomes.not_runnable_here)."""
    caplog.set_level("INFO", logger="cronbox")
    [job_id] = dispatch(runtime, registry, "send", [{"n": 1}])
    publish(runtime)
    elsewhere = Registry()  # a worker running other code: "sms" forwarded, no "send" job
    runtime.registry, mine = elsewhere, runtime.registry
    try:
        worker = BrokerWorker(runtime, parse_url(rabbit.url), [forwarded.declared], stop_when_empty=True)
        worker.work(Budget(max_time=30, memory_mb=None))
    finally:
        runtime.registry = mine
    row = job_rows(runtime, [job_id])[job_id]
    assert worker.broker_stats.not_here == ["send"]
    assert row.status == "ready" and row.attempts == 0 and "no handler send" in row.last_error
    assert row.available_at > clock.utcnow() + timedelta(seconds=50)
    assert (worker.stats.deferred, worker.stats.lease_lost, worker.stats.done) == (1, 0, 0)
    [line] = [r.getMessage() for r in caplog.records if f"job={job_id} " in r.getMessage()]
    assert line.startswith(f"job={job_id} queue=sms handler=send outcome=retry-later attempt=0/? ")
    assert line.endswith("(not registered here; waiting 60s, no attempt used)") and "no handler send" in line


@pytest.mark.backends("sqlite")  # declarations only: no row is written
def test_forward_jobs_refuses_what_the_broker_or_the_rows_cannot_take():
    registry = Registry()
    for queue, kwargs in [("", {}), ("a b", {}), ("x" * 65, {}), ("sms", {"broker_queue": "amq.jobs"}),
                          ("sms", {"broker_queue": "q" * 256}), ("sms", {"broker_queue": "a\nb"}),
                          ("sms", {"republish_after": 0.5}), ("sms", {"republish_after": True})]:
        with pytest.raises(RegistrationError):
            forward_jobs(queue, registry=registry, **kwargs)
    forward_jobs("sms", registry=registry)
    forward_jobs("sms", registry=registry)  # the same declaration again: a module imported twice
    with pytest.raises(RegistrationError):
        forward_jobs("sms", broker_queue="elsewhere", registry=registry)
    assert registry.broker_queues.get("sms").broker_queue == "cronbox.jobs.sms"


def test_a_stopping_worker_gives_what_it_did_not_start_back_to_the_queue_as_it_was_sent(runtime, registry, rabbit,
                                                                                       forwarded):
    """Issue 35 (12): the jobs a stopping worker read, or took with the one it ran, but did not start
    go back to the broker queue as they were sent: their rows reserved under their messages' tokens
    again, no attempt used, so the next worker runs them with no tick in between."""
    ids = dispatch(runtime, registry, "send", [{"n": n} for n in range(4)])
    publish(runtime)
    sent = {r.id: r.claim_token for r in job_rows(runtime, ids).values()}
    worker = work(runtime, rabbit, forwarded, max_handled=1)  # stops after one job
    assert worker.stats.done == 1
    left = [r for r in job_rows(runtime, ids).values() if r.status != "done"]
    assert len(left) == 3
    assert [(r.status, r.claim_token, r.reserved_at, r.attempts) for r in left] == \
           [("reserved", sent[r.id], None, 0) for r in left]
    assert waiting(rabbit, forwarded.broker_queue) == 3
    assert work(runtime, rabbit, forwarded).broker_stats.stale == 0  # no publish in between
    rows = job_rows(runtime, ids)
    assert {r.status for r in rows.values()} == {"done"} and {r.attempts for r in rows.values()} == {1}
    assert sorted(n for _c, n, _a in effects(runtime)) == [0, 1, 2, 3]


@pytest.mark.backends("sqlite")  # declarations only: no row is written
def test_celery_task_declares_its_queue_for_celery_and_refuses_a_cronbox_queue():
    registry = Registry()
    task = celery_task("reports.build", queue="reports", registry=registry)
    assert registry.broker_queues.get("reports").protocol == "celery"
    assert registry.broker_queues.get("reports").broker_queue == "reports"  # what `celery worker -Q reports` reads
    assert registry.jobs.get("reports.build") is task and task.queue == "reports"
    forward_jobs("sms", registry=registry)
    for name, queue in [("x", "sms"), ("", "reports"), ("a\nb", "reports"), ("r" * 200, "reports")]:
        with pytest.raises(RegistrationError):
            celery_task(name, queue=queue, registry=registry)
    with pytest.raises(RegistrationError):
        forward_jobs("reports", registry=registry)  # the same queue for cronbox's workers too
    with pytest.raises(RegistrationError):
        forward_jobs("other", protocol="stomp", registry=registry)
    with pytest.raises(RegistrationError):  # one name, one queue: a second would leave the first's jobs unsent
        celery_task("reports.build", queue="other", registry=registry)


@pytest.mark.parametrize("payload, args, kwargs", [([1, "a"], [1, "a"], {}), ({"id": 7}, [], {"id": 7}),
                                                   (None, [], {}), ("text", ["text"], {})])
@pytest.mark.backends("sqlite")  # a message made from a claimed row's values: no database
def test_a_celery_message_is_protocol_2_with_the_payload_as_arguments(payload, args, kwargs):
    item = jobstore.ClaimedJob(42, "reports", "reports.build", json.dumps(payload), 1, "tok", clock.utcnow(), None,
                               "trace42")
    message = celery_messages.message_for("reports", item, origin="cronbox@test")
    assert (message.exchange, message.routing_key) == ("", "reports")
    assert json.loads(message.body) == [args, kwargs, {"callbacks": None, "errbacks": None, "chain": None,
                                                       "chord": None}]
    headers = message.properties["application_headers"]
    assert headers["task"] == "reports.build" and headers["lang"] == "py" and headers["retries"] == 0
    assert headers["id"] == headers["root_id"] == message.properties["correlation_id"]
    assert headers["argsrepr"] == headers["kwargsrepr"] == "<cronbox job 42>"  # never the arguments
    again = celery_messages.message_for("reports", item, origin="cronbox@test")
    assert again.properties["correlation_id"] == message.properties["correlation_id"]  # one task id per job


def test_a_worker_whose_connection_the_broker_closes_reconnects_and_runs_every_job_once(runtime, registry, rabbit,
                                                                                      forwarded):
    inside, release = threading.Event(), threading.Event()

    @cronbox.job("sms", name="held", timeout=300, registry=registry)
    def held(payload, ctx):
        """Keeps the worker mid-run, its connection open, until the test has closed that connection
        (rabbitmqctl takes seconds on a loaded machine: the other jobs alone could all be done by then)."""
        inside.set()
        release.wait(300)
        ctx.session.execute(consumed.insert().values(consumer="held", n=payload["n"], attempt=ctx.attempt))

    ids = dispatch(runtime, registry, "send", [{"n": n} for n in range(5)])
    ids += dispatch(runtime, registry, "held", [{"n": 5}])
    ids += dispatch(runtime, registry, "send", [{"n": n} for n in range(6, 30)])
    publish(runtime)
    worker = BrokerWorker(runtime, parse_url(rabbit.url), [forwarded.declared], stop_when_empty=True)
    results = []
    thread = threading.Thread(target=lambda: results.append(worker.work(Budget(max_time=300, memory_mb=None))))
    thread.start()
    try:
        assert inside.wait(120), "the worker never reached the sixth job"
        assert rabbit.close_cronbox_connections("cronbox worker") == 1  # rabbitmqctl close_connection, mid-run
    finally:
        release.set()
    thread.join(300)
    assert results and results[0].exit_code == 0, results
    assert worker.broker_stats.connects >= 2
    rows = job_rows(runtime, ids)
    assert {r.status for r in rows.values()} == {"done"}
    assert sorted(n for _c, n, _a in effects(runtime)) == list(range(30))  # each once


@pytest.mark.parametrize("lost", ["driver", "pending-rollback"])
def test_the_database_lost_at_a_take_gives_the_messages_back_and_the_worker_goes_on(runtime, registry, rabbit,
                                                                                   forwarded, monkeypatch, lost):
    ids = dispatch(runtime, registry, "send", [{"n": n} for n in range(6)])
    publish(runtime)
    monkeypatch.setattr(broker_loop, "DB_PAUSE", 0.1)
    real_take, failed = jobstore.take, []

    def take(*args, **kwargs):  # the connection lost once, as SQLAlchemy reports it either way
        if not failed:
            failed.append(lost)
            if lost == "driver":
                raise OperationalError("UPDATE cronbox_jobs ...", {}, Exception("lost connection"),
                                       connection_invalidated=True)
            raise PendingRollbackError("Can't reconnect until invalid transaction is rolled back.", code="8s2b")
        return real_take(*args, **kwargs)

    monkeypatch.setattr(jobstore, "take", take)
    worker = work(runtime, rabbit, forwarded)
    assert failed == [lost] and worker.stats.done == 6
    rows = job_rows(runtime, ids)
    assert {r.status for r in rows.values()} == {"done"} and {r.attempts for r in rows.values()} == {1}
    assert sorted(n for _c, n, _a in effects(runtime)) == list(range(6))
