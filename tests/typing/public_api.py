"""The public API used as the README and examples/clinic use it, for the type checker (.ci/run runs
mypy on this file and on `cronbox`): a change that breaks a user's typed code fails CI here.
tests/units/test_public_api.py imports it, so it also stays valid Python; nothing runs on import."""
from __future__ import annotations

from datetime import timedelta

from flask import Flask
from flask_sqlalchemy import SQLAlchemy

import cronbox
from cronbox import (Context, Cronbox, Event, PermanentFailure, RetryLater, UploadRefused,
                     alembic_include_name, alembic_include_object, celery_task, consumer, forward, forward_jobs, job,
                     record,
                     request_client, schedule, seal_upload, send_email, send_sms, upload_csrf_token)


def set_up(db: SQLAlchemy) -> tuple[Flask, Cronbox]:
    extension = Cronbox()
    app = Flask(__name__)
    app.config.update(CRONBOX_HANDLERS="clinic.handlers")
    db.init_app(app)
    extension.init_app(app, db=db, console_operator=lambda request: "staff", upload_operator=None)
    return app, extension


def handlers(db: SQLAlchemy) -> None:
    @consumer("appointment.paid", name="clinic.receipt", max_attempts=5, backoff=[10, 60])
    def send_receipt(event: Event, ctx: Context) -> None:
        if event.payload.get("missing"):
            raise PermanentFailure("no such appointment")
        ctx.session.flush()
        send_sms.dispatch(db.session, {"to": "+100", "text": "paid"})
        send_email.dispatch(ctx.session, {"to": "a@example.org", "subject": "s", "text": "t"})

    @job("reports", name="clinic.report", tries=3, unique=True, rate_limit="10/m")
    def report(payload: dict, ctx: Context) -> None:
        raise RetryLater(30)

    @schedule.every(hours=1, name="clinic.hourly")
    def hourly(ctx: Context) -> None:
        report.dispatch(ctx.session, {"day": 1}, delay=timedelta(minutes=5), unique_key="day-1")

    @schedule.cron("0 7 * * *", tz="Asia/Tehran")
    def morning(ctx: Context) -> None:
        pass

    to_broker = forward("appointment.*", exchange="clinic", routing_key=lambda e: e.type)
    on_rabbitmq = forward_jobs("reports", republish_after=3600)
    build = celery_task("reports.build", queue="celery")
    celery_job_id: int | None = build.dispatch(db.session, [7])
    del celery_job_id
    names: list[str] = [send_receipt.consumer_name, report.job.name, hourly.task_name, morning.task_name,
                        to_broker.name, on_rabbitmq.broker_queue]
    job_id: int | None = report.dispatch(db.session, {"day": 2})
    del names, job_id


def in_a_request(app: Flask, extension: Cronbox, db: SQLAlchemy) -> str:
    with app.test_request_context():
        event = record(db.session, "appointment.paid", {"appointment_id": 1}, key="appointment:1")
        trace: str = event.trace_id
        try:
            upload = seal_upload(session=db.session, owner="patient:1", client=request_client())
        except UploadRefused as refused:
            return f"{refused.status} {refused.message} {trace}"
        store = extension.storage
        grant_id: str = store.grant(db.session, upload.file_id, "patient:1", expires_in=3600, max_uses=3)
        db.session.commit()
        token: str = upload_csrf_token()
        url: str = store.signed_url(grant_id, ttl=300)
        assert cronbox.CronboxError is not None and callable(alembic_include_name) and callable(alembic_include_object)
        return url + token


def a_users_test(app: Flask) -> None:
    """cronbox.testing as docs/testing.md and examples/clinic's tests use it."""
    from datetime import datetime

    from cronbox import testing
    from cronbox.testing import Kit, assert_dispatched

    with Kit(app, now=datetime(2026, 12, 2, 9, 0)) as kit:
        [event] = kit.assert_recorded("appointment.paid", appointment_id=7)
        assert event.delivery("clinic.receipt").status == "done"
        ran: testing.Ran = kit.deliver() + kit.drain(until=timedelta(minutes=1))
        assert ran.handled >= 0
        jobs: list[testing.JobRow] = assert_dispatched(send_sms, to="+989121234567")
        assert jobs[0].retrying or jobs[0].done
        kit.clock.advance(minutes=5)
        testing.clock.set(datetime(2026, 12, 3, 18, 0))
        assert kit.tick().jobs_done >= 0 and kit.perform(send_sms, {"to": "+1", "text": "t"}).ok
        assert [message.text for message in kit.outbox.sms] == [message.text for message in testing.outbox.sms]
        with kit.inline():
            kit.refute_dispatched(send_sms, queue="sms")


def batches_and_chains(db: SQLAlchemy) -> None:
    """Issue 39 as docs/howto/batches.md uses it: results, idempotency keys, batches, chains."""
    @job("sms", name="clinic.remind")
    def remind(payload: dict, ctx: Context) -> dict:
        return {"patient": payload["patient"]}

    @job("mail", name="clinic.summary")
    def summary(payload: dict, ctx: Context) -> None:
        batch: cronbox.Batch = ctx.batch
        progress: cronbox.Progress = batch.progress(ctx.session)
        reached = [value for _job_id, value in batch.results(ctx.session, page_size=100)]
        assert progress.total >= len(reached) and progress.state in ("running", "finished")
        assert ctx.previous is None

    batch = cronbox.batch(db.session, name="reminders", then=summary, catch=summary, finally_=summary,
                          allow_failures=True, payload={"day": "2026-12-07"})
    member: int | None = remind.dispatch(db.session, {"patient": 7}, batch=batch)
    again = remind.dispatch(db.session, {"patient": 7}, idempotency_key="request-1")
    batch.add(db.session, remind, {"patient": 8})
    if member is not None and again is not None:
        result: cronbox.JobResult = remind.result(db.session, again)
        assert result.ready or result.status == "pending"
    stopped: int = cronbox.cancel_batch(db.session, batch)
    chain: cronbox.Chain = cronbox.chain(db.session, [(remind, {"patient": 7}), (summary, None)], catch=summary)
    assert stopped >= 0 and chain.first_job_id > 0
    steps: cronbox.ChainProgress = chain.progress(db.session)
    on: cronbox.ChainStep | None = steps.current
    again_read: cronbox.ChainProgress | None = cronbox.chain_progress(db.session, chain.first_job_id)
    assert steps.state in ("running", "finished", "failed") and (on is None or on.index >= 0) and again_read
