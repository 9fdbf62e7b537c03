"""Webhook alerts against a real HTTP server on loopback: signed as the docs' receiver code checks,
once per problem per hour with a recovery notice (health.alert_on), a 500 retried, 401 pausing the
channel, and neither the secret nor the URL's path in a log line or an attempt row."""
from __future__ import annotations

import json
import logging
import socket
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from cronbox.cron.scheduling import health
from cronbox.outbox.channels import admin_alert, webhook
from cronbox.outbox.channels.config import channel_config
from cronbox.outbox.channels.models import SendAttempt
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.registry import DEFAULT
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.queue.models import ChannelPause, Job
from cronbox.outbox.queue.worker import Worker
from tests.conftest import ONE_MYSQL_MODE
from tests.fake_providers import SHAPES, WebhookReceiver, measured, wait_for
from tests.registries import copy_of
from tests.docs_snippets import snippet

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)

T0 = datetime(2026, 11, 30, 12, 2, 30)
SECRET = "whsec-" + "k" * 32
PATH = "/hooks/T0KEN-IN-THE-PATH"


def readme_verify():
    """The receiver's code from docs/howto/metrics-alerts.md's "Webhook alerts", as a reader would paste it."""
    code = snippet("docs/howto/metrics-alerts.md", "def verify_cronbox_alert")
    namespace: dict = {}
    exec(compile(code, "docs/howto/metrics-alerts.md", "exec"), namespace)
    return namespace["verify_cronbox_alert"]


def unix(at: datetime) -> int:
    return int((at - datetime(1970, 1, 1)).total_seconds())


@pytest.fixture
def receiver():
    with WebhookReceiver() as r:
        yield r


@pytest.fixture
def hook_rt(env, runtime, receiver):
    settings = load_settings(environ={**env, "CRONBOX_ALERT_WEBHOOK_URL": receiver.url + PATH,
                                      "CRONBOX_ALERT_WEBHOOK_SECRET": SECRET, "CRONBOX_CHANNEL_TIMEOUT": "2",
                                      "CRONBOX_ADMIN_EMAIL": "ops@example.com", "CRONBOX_MAIL_DRIVER": "log"})
    rt = Runtime(settings, registry=copy_of(DEFAULT))
    yield rt
    rt.dispose()


def work(rt):
    worker = Worker(rt, ["webhook"])
    worker.run(Budget(max_time=30, memory_mb=None))
    return worker.stats


def attempts(rt) -> list[SendAttempt]:
    with rt.sessions() as session:
        return list(session.scalars(select(SendAttempt).where(SendAttempt.channel == "webhook").order_by(SendAttempt.id)))


def test_health_alerts_arrive_signed_once_an_hour_and_recovery_is_sent(hook_rt, receiver, caplog):
    caplog.set_level(logging.DEBUG)
    verify = readme_verify()
    failing = [health.Check("tick", "fail", "last tick 900s ago")]
    sent_at = []
    with clock.frozen(T0):
        for minutes, checks in ((0, failing), (30, failing), (61, failing),
                                (70, [health.Check("tick", "ok", "last tick 20s ago")])):
            clock.advance(minutes * 60 - (clock.utcnow() - T0).total_seconds())
            health.alert_on(hook_rt, health.Report(checks[0].status, clock.utcnow(), checks))
            stats = work(hook_rt)
            assert stats.gave_up == 0 and stats.retried == 0
            sent_at.append(clock.utcnow())
    assert len(receiver.received) == 3  # 12:02 fail, 12:32 quiet, 13:03 fail again, 13:12 recovered
    bodies = []
    for (path, headers, body), at in zip(receiver.received, [sent_at[0], sent_at[2], sent_at[3]]):
        assert path == PATH and headers["Content-Type"] == "application/json"
        alert = verify(SECRET, headers["X-Cronbox-Signature"], body, now=unix(at))
        assert headers["X-Cronbox-Signature"].startswith(f"t={unix(at)},v1=")
        bodies.append(alert)
        with pytest.raises(ValueError):
            verify(SECRET, headers["X-Cronbox-Signature"], body.replace(b"tick", b"tock"), now=unix(at))
        with pytest.raises(ValueError):
            verify("another-secret", headers["X-Cronbox-Signature"], body, now=unix(at))
        with pytest.raises(ValueError):  # a replay ten minutes later
            verify(SECRET, headers["X-Cronbox-Signature"], body, now=unix(at) + 600)
    assert [(b["check"], b["status"], b["recovery"]) for b in bodies] == [
        ("tick", "fail", False), ("tick", "fail", False), ("tick", "ok", True)]
    assert bodies[0]["time"] == "2026-11-30T12:02:30Z" and bodies[0]["host"] == socket.gethostname()
    assert "last tick 900s ago" in bodies[0]["message"] and "recovered" in bodies[2]["message"]
    assert len({b["id"] for b in bodies}) == 3
    assert [a.outcome for a in attempts(hook_rt)] == ["sending", "sent"] * 3
    assert {a.recipient_masked for a in attempts(hook_rt)} == {receiver.url}  # scheme and host only
    assert_no_secret(hook_rt, caplog)


def assert_no_secret(rt, caplog):
    rows = [json.dumps({c.name: str(getattr(a, c.name)) for c in SendAttempt.__table__.columns}) for a in attempts(rt)]
    for text in [caplog.text, *rows]:
        assert SECRET not in text and "T0KEN-IN-THE-PATH" not in text
    assert SECRET not in repr(channel_config(rt.settings))


def test_a_500_is_retried_with_the_same_id_and_then_delivered(hook_rt, receiver, caplog):
    caplog.set_level(logging.DEBUG)
    receiver.answers = [500]
    with clock.frozen(T0):
        with hook_rt.sessions.begin() as session:
            assert admin_alert(session, hook_rt.settings, key="disk:1", subject="disk full", body="2% free",
                               check="disk") == ["webhook", "mail"]
        first = work(hook_rt)
        with hook_rt.sessions() as session:
            job = session.scalars(select(Job).where(Job.handler == "cronbox.webhook")).one()
        assert first.retried == 1 and job.status == "ready" and job.attempts == 1 and "HTTP 500" in job.last_error
        clock.advance((job.available_at - T0).total_seconds() + 1)
        assert work(hook_rt).done == 1
    assert len(receiver.received) == 2
    ids = [json.loads(body)["id"] for _, _, body in receiver.received]
    assert ids[0] == ids[1]  # the receiver can tell a resend
    assert [(a.outcome, a.http_status) for a in attempts(hook_rt)] == [
        ("sending", None), ("not-sent", 500), ("sending", None), ("sent", 200)]
    assert_no_secret(hook_rt, caplog)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("answer, outcome", [(200, "sent"), (500, "not-sent"), (400, "rejected")])
def test_a_huge_endless_or_slow_answer_is_read_bounded_and_classified(hook_rt, receiver, shape, answer, outcome):
    """The receiver's answer used to be read whole: at most http.MAX_BODY, within the timeout, the status decides."""
    receiver.shape, receiver.answers = shape, [answer]
    with clock.frozen(T0):
        with hook_rt.sessions.begin() as session:
            admin_alert(session, hook_rt.settings, key="disk:9", subject="disk full", body="1% free")
        peak, seconds = measured(lambda: work(hook_rt))
        with hook_rt.sessions() as session:
            job = session.scalars(select(Job).where(Job.handler == "cronbox.webhook")).one()
    assert peak < 4 * 2**20, peak
    assert seconds < 30  # the slow body (a minute whole) is given up after CRONBOX_CHANNEL_TIMEOUT (2 s)
    assert [a.outcome for a in attempts(hook_rt)] == ["sending", outcome]
    assert job.status == {"sent": "done", "not-sent": "ready", "rejected": "failed"}[outcome]
    assert job.last_error is None or len(job.last_error) < 200
    if shape != "slow":  # the client hung up long before 48 MiB (or for ever)
        assert wait_for(lambda: receiver.written) and receiver.written[0] < 16 * 2**20


def test_no_answer_in_time_is_sent_again_with_the_same_id(hook_rt, receiver):
    receiver.delays = [3.0]  # over CRONBOX_CHANNEL_TIMEOUT=2: sent, but the answer never comes in time
    with clock.frozen(T0):
        with hook_rt.sessions.begin() as session:
            admin_alert(session, hook_rt.settings, key="disk:3", subject="disk full", body="0% free")
        assert work(hook_rt).retried == 1
        with hook_rt.sessions() as session:
            job = session.scalars(select(Job).where(Job.handler == "cronbox.webhook")).one()
        clock.advance((job.available_at - T0).total_seconds() + 1)
        assert work(hook_rt).done == 1
    ids = [json.loads(body)["id"] for _, _, body in receiver.received]
    assert len(ids) == 2 and ids[0] == ids[1]  # at-least-once, and the receiver can tell
    assert [a.outcome for a in attempts(hook_rt)] == ["sending", "unknown", "sending", "sent"]


def test_a_refused_signature_pauses_the_channel_and_alerts_by_mail(hook_rt, receiver):
    receiver.answers = [401]
    with clock.frozen(T0):
        with hook_rt.sessions.begin() as session:
            admin_alert(session, hook_rt.settings, key="disk:2", subject="disk full", body="1% free")
        assert work(hook_rt).deferred == 1
        with hook_rt.sessions() as session:
            pause = session.get(ChannelPause, "webhook")
            mails = [j.unique_key for j in session.scalars(select(Job).where(Job.handler == "cronbox.email"))]
            webhooks = session.scalars(select(Job).where(Job.handler == "cronbox.webhook")).all()
    assert pause is not None and "401" in pause.reason
    assert "cronbox.email:alert:channel-paused:webhook" in mails  # told by the other channel, not by itself
    assert len(webhooks) == 1 and webhooks[0].attempts == 0  # waits for the fix without using an attempt


@pytest.mark.parametrize("url, secret, message", [
    ("http://hooks.example.com/x", SECRET, "https"),
    ("ftp://127.0.0.1/x", SECRET, "https"),
    ("https://hooks.example.com/x", None, "together"),
    (None, SECRET, "together"),
])
def test_bad_webhook_settings_are_one_line_errors(env, url, secret, message):
    extra = {k: v for k, v in (("CRONBOX_ALERT_WEBHOOK_URL", url), ("CRONBOX_ALERT_WEBHOOK_SECRET", secret)) if v}
    with pytest.raises(SettingsError, match=message) as caught:
        channel_config(load_settings(environ={**env, **extra}))
    assert SECRET not in str(caught.value) and "\n" not in str(caught.value)


def test_loopback_http_and_https_anywhere_are_accepted(env):
    for url in ("http://127.0.0.1:8080/h", "http://[::1]/h", "http://localhost/h", "https://hooks.example.com/h"):
        config = channel_config(load_settings(environ={**env, "CRONBOX_ALERT_WEBHOOK_URL": url,
                                                       "CRONBOX_ALERT_WEBHOOK_SECRET": SECRET}))
        assert config.webhook_url == url
    assert webhook.where("https://user:pw@hooks.example.com:8443/T0KEN?x=1") == "https://hooks.example.com:8443"
