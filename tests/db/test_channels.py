"""SMS and e-mail channels against real local servers (HTTP fakes of Kavenegar/Twilio, aiosmtpd)."""
from __future__ import annotations

import asyncio
import socket
from datetime import datetime, timedelta

import pytest
from aiosmtpd.controller import Controller
from sqlalchemy import select

from cronbox.outbox.channels import notify, send_email, send_sms
from cronbox.outbox.channels.jobs import add_notification
from cronbox.outbox.channels.models import Notification, SendAttempt
from cronbox.outbox.core import clock
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.engine.registry import DEFAULT
from cronbox.outbox.queue.models import ChannelPause, Job
from cronbox.outbox.queue.worker import Worker
from tests.fake_providers import API_KEY, SHAPES, measured, wait_for, TWILIO_SID, TWILIO_TOKEN, Providers
from tests.registries import copy_of
from tests.helpers import opened_payload

# The channels' drivers against their servers on loopback: the database behind their rows changes
# nothing, so not PostgreSQL too (.ci/run's 30 minutes; the job queue itself runs there in test_queue).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

T0 = datetime(2026, 11, 30, 12, 0, 0)
SECRET_TEXT = "Your code is 4711-SECRET"


@pytest.fixture
def providers():
    # A slow answer comes long after CRONBOX_CHANNEL_TIMEOUT (0.5 s) however loaded the machine; the
    # end of the test releases it.
    with Providers(slow_seconds=30) as p:
        yield p
        p.release.set()


def make_runtime(env, runtime, **channel_env) -> Runtime:
    settings = load_settings(environ={**env, "CRONBOX_CHANNEL_TIMEOUT": "0.5", "CRONBOX_SMS_SENDER": "10004346",
                                      "CRONBOX_ADMIN_EMAIL": "ops@example.com", **channel_env})
    return Runtime(settings, registry=copy_of(DEFAULT))  # the channels' jobs, registered on import


@pytest.fixture(params=["kavenegar", "twilio"])
def sms_rt(request, env, runtime, providers):
    driver = request.param
    extra = ({"CRONBOX_SMS_DRIVER": "kavenegar", "CRONBOX_KAVENEGAR_URL": providers.url,
              "CRONBOX_KAVENEGAR_API_KEY": API_KEY} if driver == "kavenegar" else
             {"CRONBOX_SMS_DRIVER": "twilio", "CRONBOX_TWILIO_URL": providers.url,
              "CRONBOX_TWILIO_ACCOUNT_SID": TWILIO_SID, "CRONBOX_TWILIO_AUTH_TOKEN": TWILIO_TOKEN})
    rt = make_runtime(env, runtime, **extra)
    rt.driver = driver
    yield rt
    rt.dispose()


def work(rt, queues=("sms",)):
    worker = Worker(rt, list(queues))
    worker.run(Budget(max_time=30, memory_mb=None))
    return worker.stats


def dispatch_sms(rt, to: str) -> int:
    with rt.sessions.begin() as session:
        return send_sms.dispatch(session, {"to": to, "text": SECRET_TEXT})


def job(rt, job_id: int) -> Job:
    with rt.sessions() as session:
        return session.get(Job, job_id)


def outcomes(rt, *, with_sending: bool = False) -> list[str]:
    with rt.sessions() as session:
        found = list(session.scalars(select(SendAttempt.outcome).order_by(SendAttempt.id)))
    return found if with_sending else [o for o in found if o != "sending"]


def test_sent_masked_in_logs_attempt_recorded(sms_rt, providers, caplog):
    caplog.set_level("INFO", logger="cronbox")
    job_id = dispatch_sms(sms_rt, "+989120000000")
    assert work(sms_rt).done == 1
    assert job(sms_rt, job_id).status == "done"
    assert outcomes(sms_rt) == ["sent"]
    [form] = providers.sends(sms_rt.driver)
    assert SECRET_TEXT in form.values()
    if sms_rt.driver == "kavenegar":
        assert form["localid"].isdigit() and form["sender"] == "10004346"
    text = caplog.text
    assert "+98*******000" in text
    assert "9120000000" not in text and SECRET_TEXT not in text and API_KEY not in text and TWILIO_TOKEN not in text
    assert outcomes(sms_rt, with_sending=True) == ["sending", "sent"]
    with sms_rt.sessions() as session:
        attempt = session.scalars(select(SendAttempt).where(SendAttempt.outcome == "sent")).one()
    assert attempt.recipient_masked == "+98*******000" and attempt.provider_id


def test_invalid_number_fails_at_once(sms_rt, providers):
    job_id = dispatch_sms(sms_rt, "+989121111111")
    work(sms_rt)
    row = job(sms_rt, job_id)
    assert row.status == "failed" and row.attempts == 1 and row.error_class == "PermanentFailure"
    assert outcomes(sms_rt) == ["rejected"]


def test_throttled_waits_without_an_attempt(sms_rt, providers):
    with clock.frozen(T0):
        job_id = dispatch_sms(sms_rt, "+989124444290")
        stats = work(sms_rt)
        row = job(sms_rt, job_id)
    assert stats.deferred == 1 and row.status == "ready" and row.attempts == 0
    assert (row.available_at - T0).total_seconds() == pytest.approx(30, abs=1)  # Retry-After
    assert outcomes(sms_rt) == ["retry-later"]


def test_server_error_retries_with_backoff(sms_rt, providers):
    with clock.frozen(T0):
        job_id = dispatch_sms(sms_rt, "+989125555000")
        stats = work(sms_rt)
        row = job(sms_rt, job_id)
    assert stats.retried == 1 and row.status == "ready" and row.attempts == 1
    assert "HTTP 500" in row.last_error and row.available_at > T0
    assert outcomes(sms_rt) == ["not-sent"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("number, status, outcome", [
    ("+989120000000", "done", "sent"), ("+989125555000", "ready", "not-sent"), ("+989121111111", "failed", "rejected"),
])
def test_a_huge_endless_or_slow_answer_is_read_bounded_and_classified(sms_rt, providers, shape, number, status,
                                                                     outcome):
    """Answers used to be read whole (48 MiB in memory): at most http.MAX_BODY is read, within the timeout,
    and the status code still decides; the JSON cut short is no crash and no long error."""
    providers.shape = shape
    with clock.frozen(T0):
        job_id = dispatch_sms(sms_rt, number)
        peak, seconds = measured(lambda: work(sms_rt))
        row = job(sms_rt, job_id)
    assert peak < 4 * 2**20, peak
    assert seconds < 30  # the slow body (a minute whole) is given up after CRONBOX_CHANNEL_TIMEOUT (0.5 s)
    assert row.status == status and outcomes(sms_rt) == [outcome]
    assert row.last_error is None or len(row.last_error) < 200
    if shape != "slow":  # the client hung up long before 48 MiB (or for ever)
        assert wait_for(lambda: providers.written) and max(providers.written) < 16 * 2**20


def test_out_of_credit_pauses_the_channel_and_alerts_once(sms_rt, providers):
    with clock.frozen(T0):
        first = dispatch_sms(sms_rt, "+989124444180")
        second = dispatch_sms(sms_rt, "+989120000000")
        stats = work(sms_rt)
        assert stats.deferred == 2 and stats.done == 0
        assert len(providers.sends(sms_rt.driver)) == 1  # the second job waited without calling the provider
        assert all(job(sms_rt, i).attempts == 0 and job(sms_rt, i).status == "ready" for i in (first, second))
        with sms_rt.sessions() as session:
            pause = session.get(ChannelPause, "sms")
            alerts = session.scalars(select(Job).where(Job.handler == "cronbox.email")).all()
        assert pause.paused_until == T0 + timedelta(seconds=900)
        assert len(alerts) == 1 and alerts[0].unique_key == "cronbox.email:alert:channel-paused:sms"
        text = opened_payload(sms_rt, alerts[0])
        assert "ops@example.com" in text and "sms channel paused" in text
        clock.advance(901)
        with sms_rt.sessions.begin() as session:
            session.execute(Job.__table__.delete().where(Job.id == first))
        assert work(sms_rt).done == 1
    assert job(sms_rt, second).status == "done"


def test_timeout_is_an_unknown_outcome_and_never_resent_blindly(sms_rt, providers):
    with clock.frozen(clock.utcnow()):  # real time: Twilio's lookup compares with the server's clock
        job_id = dispatch_sms(sms_rt, "+989129999999")
        work(sms_rt)
        row = job(sms_rt, job_id)
        assert row.status == "ready" and row.attempts == 1 and "OutcomeUnknown" in row.last_error
        clock.advance(3600)
        work(sms_rt)
    assert job(sms_rt, job_id).status == "done"
    assert len(providers.sends(sms_rt.driver)) == 1  # looked up, found, not sent again
    assert outcomes(sms_rt) == ["unknown", "found"]


def test_a_send_cut_off_by_the_job_timeout_is_looked_up_not_resent(sms_rt, providers, monkeypatch):
    """No socket timeout this time: the job's own timer interrupts the POST (as a SIGKILL would):
    only the "sending" row tells the next attempt that the message may be out.
    The provider holds its answer until the test is done (at most 120 s, longer than the socket
    timeout), so the timer can only fire inside the POST once the handler got there: 5 s, which the
    "sending" row's commit and a loopback connect take well within on a loaded machine (0.3 s did
    not: the timer fired before the POST, nothing was sent, the next attempt sent it)."""
    providers.slow_seconds = 120
    slow = make_runtime_like(sms_rt, CRONBOX_CHANNEL_TIMEOUT="60")
    slow.registry.jobs.add(_replace(slow.registry.jobs.get("cronbox.sms"), timeout=5))
    try:
        with clock.frozen(clock.utcnow()):
            job_id = dispatch_sms(slow, "+989129999999")
            work(slow)
            row = job(slow, job_id)
            assert row.status == "ready" and "HandlerTimeout" in row.last_error
            assert outcomes(slow, with_sending=True) == ["sending"]
            clock.advance(3600)
            work(slow)
        assert job(slow, job_id).status == "done"
        assert len(providers.sends(sms_rt.driver)) == 1
        assert outcomes(slow) == ["found"]
    finally:
        providers.release.set()
        slow.dispose()


def make_runtime_like(rt, **extra) -> Runtime:
    return Runtime(load_settings(environ={**rt.settings.raw, **extra}), registry=copy_of(DEFAULT))


def _replace(handler, **changes):
    from dataclasses import replace
    return replace(handler, **changes)


def test_twilio_lookup_failure_fails_as_outcome_unknown_and_alerts(env, runtime, providers):
    rt = make_runtime(env, runtime, CRONBOX_SMS_DRIVER="twilio", CRONBOX_TWILIO_URL=providers.url,
                      CRONBOX_TWILIO_ACCOUNT_SID=TWILIO_SID, CRONBOX_TWILIO_AUTH_TOKEN=TWILIO_TOKEN)
    try:
        with clock.frozen(clock.utcnow()):
            job_id = dispatch_sms(rt, "+989129999999")
            work(rt)
            providers.lookups_fail = True
            clock.advance(3600)
            work(rt)
        row = job(rt, job_id)
        assert row.status == "failed" and "outcome unknown" in row.last_error
        assert len(providers.sends("twilio")) == 1
        with rt.sessions() as session:
            alerts = session.scalars(select(Job).where(Job.handler == "cronbox.email")).all()
        assert len(alerts) == 1 and "outcome unknown" in opened_payload(rt, alerts[0])
    finally:
        rt.dispose()


def test_wrong_credentials_pause(env, runtime, providers, caplog):
    caplog.set_level("INFO", logger="cronbox")
    rt = make_runtime(env, runtime, CRONBOX_SMS_DRIVER="kavenegar", CRONBOX_KAVENEGAR_URL=providers.url,
                      CRONBOX_KAVENEGAR_API_KEY="wrong-key")
    try:
        job_id = dispatch_sms(rt, "+989120000000")
        work(rt)
        assert job(rt, job_id).attempts == 0
        with rt.sessions() as session:
            assert "invalid API key" in session.get(ChannelPause, "sms").reason
        assert "channel sms paused" in caplog.text
        assert "wrong-key" not in caplog.text + str(job(rt, job_id).last_error)
    finally:
        rt.dispose()


def test_log_driver_and_shared_rate_limit(env, runtime, caplog):
    caplog.set_level("INFO", logger="cronbox")
    rt = make_runtime(env, runtime, CRONBOX_SMS_RATE="1/m")
    try:
        with clock.frozen(T0):
            first = dispatch_sms(rt, "+989120000000")
            second = dispatch_sms(rt, "+989120000001")
            stats = work(rt)
        assert stats.done == 1 and stats.deferred == 1
        assert job(rt, first).status == "done" and job(rt, second).attempts == 0
        assert "sms (log driver) to=+98*******000 chars=24" in caplog.text and SECRET_TEXT not in caplog.text
    finally:
        rt.dispose()


def test_bad_payload_fails_the_job_permanently(env, runtime):
    rt = make_runtime(env, runtime)
    try:
        with rt.sessions.begin() as session:
            job_id = send_sms.dispatch(session, {"to": "", "text": "x"})
        work(rt)
        assert job(rt, job_id).status == "failed" and "'to' must be a non-empty string" in job(rt, job_id).last_error
    finally:
        rt.dispose()


def test_notifications_are_written_exactly_once(env, runtime):
    rt = make_runtime(env, runtime)
    try:
        with rt.sessions.begin() as session:
            notify.dispatch(session, {"to": "patient-7", "kind": "appointment", "title": "Booked", "body": "See you"})
        work(rt, ["notifications"])
        with rt.sessions() as session:
            [row] = session.scalars(select(Notification)).all()
            trace = session.scalars(select(Job.trace_id)).one()
        assert row.dedupe_key == f"job-1-{trace}"
        with rt.sessions.begin() as session:  # a repeated run of the same job adds nothing
            add_notification(session, recipient="patient-7", kind="appointment", title="Booked", body="See you",
                             dedupe_key=row.dedupe_key)
        with rt.sessions() as session:
            rows = session.scalars(select(Notification)).all()
        assert [(n.recipient, n.title) for n in rows] == [("patient-7", "Booked")]
    finally:
        rt.dispose()


# ---- e-mail -------------------------------------------------------------------------

class Mailbox:
    def __init__(self):
        self.messages = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("nobody@"):
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(envelope.content.decode("utf8", errors="replace"))
        return "250 Message accepted"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def smtp_server():
    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield controller, mailbox
    controller.stop()


def dispatch_mail(rt, to: str) -> int:
    with rt.sessions.begin() as session:
        return send_email.dispatch(session, {"to": to, "subject": "Your results", "text": "Attached soon."})


def test_email_is_delivered_over_smtp(env, runtime, smtp_server, caplog):
    caplog.set_level("INFO", logger="cronbox")
    controller, mailbox = smtp_server
    rt = make_runtime(env, runtime, CRONBOX_SMTP_HOST="127.0.0.1", CRONBOX_SMTP_PORT=str(controller.port),
                      CRONBOX_SMTP_SECURITY="none", CRONBOX_MAIL_FROM="clinic@example.com")
    try:
        job_id = dispatch_mail(rt, "patient@example.org")
        assert work(rt, ["mail"]).done == 1
        [message] = mailbox.messages
        assert "Subject: Your results" in message and f"Message-ID: <job-{job_id}-{job(rt, job_id).trace_id}@" in message
        assert outcomes(rt) == ["sent"]
        assert "patient@example.org" not in caplog.text and "to=p***@example.org" in caplog.text
    finally:
        rt.dispose()


def test_email_refused_recipient_fails_and_refused_connection_retries(env, runtime, smtp_server):
    controller, mailbox = smtp_server
    rt = make_runtime(env, runtime, CRONBOX_SMTP_HOST="127.0.0.1", CRONBOX_SMTP_PORT=str(controller.port),
                      CRONBOX_SMTP_SECURITY="none", CRONBOX_MAIL_FROM="clinic@example.com")
    closed = make_runtime(env, runtime, CRONBOX_SMTP_HOST="127.0.0.1", CRONBOX_SMTP_PORT=str(free_port()),
                          CRONBOX_SMTP_SECURITY="none", CRONBOX_MAIL_FROM="clinic@example.com")
    try:
        refused = dispatch_mail(rt, "nobody@example.org")
        work(rt, ["mail"])
        assert job(rt, refused).status == "failed" and "(550)" in job(rt, refused).last_error
        later = dispatch_mail(closed, "patient@example.org")
        work(closed, ["mail"])
        row = job(closed, later)
        assert row.status == "ready" and row.attempts == 1 and "could not connect" in row.last_error
        assert outcomes(rt) == ["rejected", "not-sent"]
        assert mailbox.messages == []
    finally:
        rt.dispose()
        closed.dispose()


@pytest.mark.parametrize("with_smtp", [False, True], ids=["no-smtp-host", "over-a-configured-smtp-server"])
def test_mail_log_driver_sends_nothing_and_records_a_masked_attempt(env, runtime, smtp_server, caplog, with_smtp):
    caplog.set_level("INFO", logger="cronbox")
    controller, mailbox = smtp_server
    smtp = {"CRONBOX_SMTP_HOST": "127.0.0.1", "CRONBOX_SMTP_PORT": str(controller.port),
            "CRONBOX_SMTP_SECURITY": "none", "CRONBOX_MAIL_FROM": "clinic@example.com"} if with_smtp else {}
    rt = make_runtime(env, runtime, **smtp, CRONBOX_MAIL_DRIVER="log")
    try:
        with rt.sessions.begin() as session:
            job_id = send_email.dispatch(session, {"to": "patient@example.org", "subject": "HIV result",
                                                   "text": SECRET_TEXT, "html": f"<p>{SECRET_TEXT}</p>"})
        assert work(rt, ["mail"]).done == 1
        assert job(rt, job_id).status == "done" and job(rt, job_id).attempts == 1
        assert mailbox.messages == []
        with rt.sessions() as session:
            [attempt] = session.scalars(select(SendAttempt)).all()
            assert session.get(ChannelPause, "mail") is None
        assert (attempt.channel, attempt.outcome, attempt.provider_status) == ("mail", "sent", "log")
        assert attempt.recipient_masked == "p***@example.org"
        assert "patient" not in (attempt.detail or "") and SECRET_TEXT not in (attempt.detail or "")
        assert "mail (log driver) to=p***@example.org" in caplog.text
        assert "patient@example.org" not in caplog.text and SECRET_TEXT not in caplog.text
        assert "HIV result" not in caplog.text
    finally:
        rt.dispose()


def test_mail_driver_setting(env):
    from cronbox.outbox.channels.config import channel_config
    from cronbox.outbox.core.errors import SettingsError

    def driver(**extra):
        return channel_config(load_settings(environ={**env, **extra})).mail_driver

    assert driver() == "smtp"  # never silently nothing: an unconfigured SMTP channel pauses and alerts
    assert driver(CRONBOX_SMTP_HOST="smtp.example.com") == "smtp"
    assert driver(CRONBOX_SMTP_HOST="smtp.example.com", CRONBOX_MAIL_DRIVER="LOG") == "log"
    assert driver(CRONBOX_MAIL_DRIVER="log") == "log"
    with pytest.raises(SettingsError, match="CRONBOX_MAIL_DRIVER='sendmail' is not one of smtp, log"):
        driver(CRONBOX_MAIL_DRIVER="sendmail")
