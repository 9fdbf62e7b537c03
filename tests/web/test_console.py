"""The operator console (/ops/) route by route through Flask's test client, on SQLite and MariaDB.

Browser tests (a real chromium) are in test_console_browser.py; the chart in test_console_chart.py.
"""
from __future__ import annotations

import io
import json
import re
import secrets
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import pytest
from sqlalchemy import func, select

from cronbox.cron.cli import main
from cronbox.cron.operator.models import OperatorAction, OperatorSession
from cronbox.cron.scheduling import once as once_requests
from cronbox.cron.scheduling.models import OnceRequest
from cronbox import outbox
import cronbox
import cronbox.outbox.channels
from cronbox.outbox.core import clock
from cronbox.outbox.engine.models import HandlerProfile, Heartbeat
from cronbox.outbox.engine.profiles import epoch
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.events.models import Delivery
from cronbox.outbox.queue import pauses
from cronbox.outbox.queue.models import ChannelPause, Job
from cronbox.storage import audit
from cronbox.outbox.core.errors import PermanentFailure
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.worker import Worker
import cronbox
from cronbox.storage.models import AuditEntry, Grant, SealedFile
from tests.web.test_host_uploads import FORM, form, part
from tests.console_helpers import GET_PAGES, PASSWORD, POST_ACTIONS, Operator, logged_in, make_app, upload_form
from tests.helpers import relay
from cronbox.cron.operator import credentials
from cronbox.cron.operator import throttle

# The console does not care how jobs are claimed: one MariaDB mode is enough here.
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")
T0 = datetime(2026, 11, 30, 12, 0, 0)


@pytest.fixture
def app(runtime, env):
    application = make_app(env, runtime)
    yield application
    application.extensions["cronbox"].runtime.dispose()


@pytest.fixture
def operator(app) -> Operator:
    return logged_in(app)


def failed_job(runtime, *, queue: str = "sms", error: str = "gateway down") -> int:
    now = clock.utcnow()
    with runtime.sessions.begin() as session:
        job = Job(queue=queue, handler="sms.send", payload='{"to": "+15550001111"}', status="failed", attempts=3,
                  trace_id=secrets.token_hex(8), created_at=now, finished_at=now, last_error=error,
                  error_class="RuntimeError")
        session.add(job)
        session.flush()
        return job.id


def job_status(runtime, job_id: int) -> str | None:
    with runtime.sessions() as session:
        job = session.get(Job, job_id)
        return job.status if job else None


def dead_deliveries(runtime, registry, count: int = 2) -> list[int]:
    @consumer("order.paid", name="mailer", max_attempts=1, registry=registry)
    def mailer(event, ctx):
        raise RuntimeError("smtp refused")

    with runtime.sessions.begin() as session:
        for n in range(count):
            cronbox.record(session, "order.paid", {"n": n})
    relay(runtime)
    with runtime.sessions() as session:
        return list(session.scalars(select(Delivery.id).where(Delivery.status == "dead").order_by(Delivery.id)))


def delivery_status(runtime, delivery_id: int) -> str:
    with runtime.sessions() as session:
        return session.get(Delivery, delivery_id).status


def actions_logged(runtime) -> list[tuple[str, str | None, str]]:
    with runtime.sessions() as session:
        return [(a.action, a.target, a.outcome) for a in
                session.scalars(select(OperatorAction).order_by(OperatorAction.id))]


def flashed(response, operator: Operator) -> str:
    assert response.status_code == 303, response.get_data(as_text=True)[:500]
    return operator.get(urlsplit(response.headers["Location"]).path).get_data(as_text=True)


# ---- who may see what -------------------------------------------------------------------------

def test_anonymous_requests_are_sent_to_login_or_refused(app, runtime):
    failed = failed_job(runtime)
    credentials.store_password(app.extensions["cronbox"].settings, PASSWORD, replace=False)
    anonymous = Operator(app)
    for path in GET_PAGES:
        response = anonymous.get(path)
        assert response.status_code == 302, path
        assert response.headers["Location"].startswith("/ops/login?next=")
    for path in POST_ACTIONS:  # a valid CSRF token from the login page, but no session
        response = anonymous.post(path, {"id": str(failed), "all": "yes", "confirm": "yes", "task": "cronbox.health",
                                         "channel": "sms",
                                         "command": "migrate", "grant": "ab" * 16}, page="/ops/login")
        assert response.status_code == 401, path
    assert job_status(runtime, failed) == "failed"
    assert anonymous.get("/ops/login").status_code == 200
    assert anonymous.get("/ops/static/ops.css").status_code == 200
    assert anonymous.get("/ops/setup").status_code == 302  # a password exists: setup is closed


def test_posts_without_a_valid_csrf_token_are_refused(operator, runtime):
    failed = failed_job(runtime)
    form = {"id": str(failed), "all": "yes", "confirm": "yes", "task": "cronbox.health", "command": "migrate",
            "password": PASSWORD, "channel": "sms"}
    for path in POST_ACTIONS + ["/ops/login", "/ops/setup"]:
        assert operator.post(path, form, csrf=False).status_code == 400, path
        assert operator.post(path, {**form, "csrf_token": "forged"}, csrf=False).status_code == 400, path
    other = Operator(operator.app)  # a token from another browser's session is no good either
    stolen = other.token()
    assert operator.post("/ops/queues/flush", {**form, "csrf_token": stolen}, csrf=False).status_code == 400
    assert job_status(runtime, failed) == "failed"
    assert operator.get("/ops/").status_code == 200  # still logged in


def test_setup_needs_the_token_and_a_good_password_then_closes(app, runtime):
    settings = app.extensions["cronbox"].settings
    browser = Operator(app)
    assert browser.get("/ops/login").headers["Location"] == "/ops/setup"
    page = browser.get("/ops/setup").get_data(as_text=True)
    token_file = credentials.token_file(settings)
    token = token_file.read_text().strip()
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token not in page and str(settings.instance) not in page

    def attempt(**form):
        return browser.post("/ops/setup", {"token": token, "password": PASSWORD, "confirm_password": PASSWORD,
                                           **form}, page="/ops/setup")

    assert attempt(token="wrong").status_code == 401
    assert attempt(confirm_password="something else entirely").status_code == 400
    assert attempt(password="short", confirm_password="short").status_code == 400
    assert not credentials.hash_file(settings).exists()
    response = attempt()
    assert response.status_code == 303 and response.headers["Location"] == "/ops/"
    assert browser.get("/ops/").status_code == 200
    assert not token_file.exists()
    assert credentials.hash_file(settings).stat().st_mode & 0o777 == 0o600
    assert PASSWORD not in credentials.hash_file(settings).read_text()
    assert Operator(app).get("/ops/setup").headers["Location"] == "/ops/login"
    assert ("setup", None, "ok") in actions_logged(runtime) and ("setup", None, "wrong-token") in actions_logged(runtime)


def test_a_hash_in_env_wins_and_setup_stays_closed(runtime, env):
    application = make_app(env, runtime, CRONBOX_OPS_PASSWORD_HASH=credentials.make_hash("from the dotenv file"))
    try:
        browser = Operator(application)
        assert browser.get("/ops/setup").headers["Location"] == "/ops/login"
        assert browser.log_in(PASSWORD).status_code == 401
        assert browser.log_in("from the dotenv file").status_code == 303
        assert browser.get("/ops/").status_code == 200
    finally:
        application.extensions["cronbox"].runtime.dispose()


def test_wrong_passwords_are_refused_then_throttled_per_client(runtime, env):
    application = make_app(env, runtime, CRONBOX_TRUSTED_PROXIES="1")
    try:
        with clock.frozen(T0):
            credentials.store_password(application.extensions["cronbox"].settings, PASSWORD, replace=False)
            guesser = Operator(application, HTTP_X_FORWARDED_FOR="203.0.113.9")
            for _ in range(throttle.PER_CLIENT[0]):
                response = guesser.log_in("guess")
                assert response.status_code == 401 and "Wrong password." in response.get_data(as_text=True)
            blocked = guesser.log_in("guess")
            assert blocked.status_code == 429 and int(blocked.headers["Retry-After"]) > 0
            assert guesser.log_in(PASSWORD).status_code == 429  # even the right one, while throttled
            assert guesser.get("/ops/").status_code == 302
            # Another client is not held back by this one; its right password gives its try back.
            colleague = Operator(application, HTTP_X_FORWARDED_FOR="198.51.100.7")
            for _ in range(throttle.PER_CLIENT[0] + 2):
                assert colleague.log_in(PASSWORD).status_code == 303
            clock.advance(throttle.PER_CLIENT[1])
            assert guesser.log_in(PASSWORD).status_code == 303
        outcomes = [o for action, _, o in actions_logged(runtime) if action == "login"]
        assert outcomes.count("wrong-password") == throttle.PER_CLIENT[0] and outcomes.count("throttled") == 1  # once per window
    finally:
        application.extensions["cronbox"].runtime.dispose()


def _fail_from_many_addresses(application, addresses: list[str], *, header: str = "HTTP_X_FORWARDED_FOR") -> None:
    """Each address spends its whole budget on wrong passwords (and one more try, refused)."""
    for address in addresses:
        guesser = Operator(application, **{header: address})
        codes = [guesser.log_in("guess").status_code for _ in range(throttle.PER_CLIENT[0] + 1)]
        assert 401 in codes and codes[-1] == 429, (address, codes)


@pytest.mark.backends("sqlite")  # the throttle above its rows (their SQL: test_queue's rate limit, every backend)
def test_other_clients_failures_never_lock_out_a_client_within_its_budget(runtime, env):
    """50 wrong passwords from 10 addresses (and more) used to lock the real operator out for the window."""
    application = make_app(env, runtime, CRONBOX_TRUSTED_PROXIES="1")
    try:
        with clock.frozen(T0):
            credentials.store_password(application.extensions["cronbox"].settings, PASSWORD, replace=False)
            guessers = [f"203.0.113.{n}" for n in range(1, 13)] + [f"2001:db8:{n}::1" for n in range(1, 4)]
            _fail_from_many_addresses(application, guessers)
            for fresh in ["198.51.100.7", "2001:db8:aa::5", "::ffff:192.0.2.200", "198.51.100.7"]:  # IPv6, mapped, again
                assert Operator(application, HTTP_X_FORWARDED_FOR=fresh).log_in(PASSWORD).status_code == 303
            # A client that mistyped once is slowed down (the global counter is full), not locked out.
            typist = Operator(application, HTTP_X_FORWARDED_FOR="192.0.2.77")
            assert typist.log_in("typo").status_code == 401
            paced = typist.log_in(PASSWORD)
            assert paced.status_code == 429 and 0 < int(paced.headers["Retry-After"]) <= throttle.PACE
            clock.advance(throttle.PACE)
            assert typist.log_in(PASSWORD).status_code == 303
            # A fresh guesser's wrong tries come once per PACE only, up to its own budget.
            late = Operator(application, HTTP_X_FORWARDED_FOR="192.0.2.99")
            assert late.log_in("guess").status_code == 401
            assert late.log_in("guess").status_code == 429
            # Over its own budget a client is locked until its window ends, then it is let in again.
            assert Operator(application, HTTP_X_FORWARDED_FOR="203.0.113.1").log_in(PASSWORD).status_code == 429
            clock.advance(throttle.PER_CLIENT[1])
            _fail_from_many_addresses(application, guessers)  # the next window: same flood, same outcome
            assert Operator(application, HTTP_X_FORWARDED_FOR="2001:db8:bb::1").log_in(PASSWORD).status_code == 303
            assert Operator(application, HTTP_X_FORWARDED_FOR="203.0.113.1").log_in(PASSWORD).status_code == 429
            clock.advance(throttle.PER_CLIENT[1])
            assert Operator(application, HTTP_X_FORWARDED_FOR="203.0.113.1").log_in(PASSWORD).status_code == 303
    finally:
        application.extensions["cronbox"].runtime.dispose()


def test_a_spoofed_forwarded_for_does_not_buy_a_fresh_budget(runtime, env):
    """Without trusted proxies the header is ignored: one connection address is one client, whatever it
    claims. With one trusted proxy only the address that proxy wrote counts, not what the client prepended."""
    direct = make_app(env, runtime)
    try:
        with clock.frozen(T0):
            credentials.store_password(direct.extensions["cronbox"].settings, PASSWORD, replace=False)
            codes = [Operator(direct, REMOTE_ADDR="192.0.2.10", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}")
                     .log_in("guess").status_code for n in range(throttle.PER_CLIENT[0] + 1)]
            assert codes == [401] * throttle.PER_CLIENT[0] + [429]
            assert Operator(direct, REMOTE_ADDR="192.0.2.10", HTTP_X_FORWARDED_FOR="198.51.100.1").log_in(
                PASSWORD).status_code == 429
            assert Operator(direct, REMOTE_ADDR="192.0.2.11").log_in(PASSWORD).status_code == 303
    finally:
        direct.extensions["cronbox"].runtime.dispose()
    proxied = make_app(env, runtime, CRONBOX_TRUSTED_PROXIES="1")
    try:
        with clock.frozen(T0 + timedelta(hours=1)):
            codes = [Operator(proxied, HTTP_X_FORWARDED_FOR=f"10.9.9.{n}, 2001:db8:5::{n}").log_in("guess").status_code
                     for n in range(1, throttle.PER_CLIENT[0] + 2)]  # rotating inside one /64, spoofing the left
            assert codes == [401] * throttle.PER_CLIENT[0] + [429]
            assert Operator(proxied, HTTP_X_FORWARDED_FOR="2001:db8:5::99").log_in(PASSWORD).status_code == 429
            assert Operator(proxied, HTTP_X_FORWARDED_FOR="2001:db8:5::99, 2001:db8:6::1").log_in(
                PASSWORD).status_code == 303
    finally:
        proxied.extensions["cronbox"].runtime.dispose()


def test_logout_ends_the_session_on_the_server(operator, runtime):
    cookie = operator.client.get_cookie("cronbox_ops", path="/ops")
    assert cookie is not None
    copy = Operator(operator.app)
    copy.client.set_cookie("cronbox_ops", cookie.value, path="/ops")
    assert copy.get("/ops/").status_code == 200  # the same cookie works in another browser...
    assert operator.post("/ops/logout").status_code == 303
    assert copy.get("/ops/").status_code == 302  # ...until logout deletes the session row
    assert operator.get("/ops/").status_code == 302
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(OperatorSession)) == 0


def test_sessions_end_when_idle_or_old(app):
    with clock.frozen(T0):
        operator = logged_in(app)
        clock.advance(2 * 3600 - 60)
        assert operator.get("/ops/").status_code == 200
        clock.advance(2 * 3600 + 1)  # idle for longer than two hours
        assert operator.get("/ops/").status_code == 302
        busy = Operator(app)
        assert busy.log_in().status_code == 303
        for _ in range(11):  # active every hour: the idle limit never bites...
            clock.advance(3600)
            assert busy.get("/ops/").status_code == 200
        clock.advance(3600)
        assert busy.get("/ops/").status_code == 302  # ...but twelve hours after login the session ends


def test_cookie_flags_and_security_headers(app):
    browser = Operator(app)
    browser.set_up()
    response = browser.client.post("/ops/login", data={"csrf_token": browser.token(), "password": PASSWORD})
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
    secure = Operator(app)
    response = secure.client.get("/ops/login", base_url="https://console.example")
    assert "Secure" in response.headers["Set-Cookie"]
    page = browser.get("/ops/")
    assert page.headers["Cache-Control"] == "no-store" and page.headers["X-Frame-Options"] == "DENY"
    assert "script-src" not in page.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert "<script" not in page.get_data(as_text=True)


def test_secure_cookie_behind_a_trusted_proxy(runtime, env):
    application = make_app(env, runtime, CRONBOX_TRUSTED_PROXIES="1")
    try:
        response = application.test_client().get("/ops/setup", headers={"X-Forwarded-Proto": "https"})
        assert "Secure" in response.headers["Set-Cookie"]
    finally:
        application.extensions["cronbox"].runtime.dispose()


def test_next_only_leads_inside_the_console(app):
    browser = Operator(app)
    browser.set_up()
    for target, expected in [("//evil.example/ops/", "/ops/"), ("https://evil.example/ops/", "/ops/"),
                             ("/elsewhere", "/ops/"), ("/ops/queues?queue=sms", "/ops/queues?queue=sms")]:
        response = browser.client.post("/ops/login", data={"csrf_token": browser.token(), "password": PASSWORD,
                                                           "next": target})
        assert response.headers["Location"] == expected


# ---- outbox ---------------------------------------------------------------------------------

def test_outbox_retry_and_skip_one_or_all(operator, runtime, registry):
    first, second = dead_deliveries(runtime, registry)
    page = operator.get("/ops/outbox").get_data(as_text=True)
    assert f'id="delivery-{first}"' in page and "smtp refused" in page and "mailer" in page

    assert "1 deliveries pending again." in flashed(operator.post("/ops/outbox/retry", {"id": str(first)}), operator)
    assert delivery_status(runtime, first) == "pending"

    ask = operator.post("/ops/outbox/skip", {"id": str(second)})
    assert ask.status_code == 200 and 'name="confirm" value="yes"' in ask.get_data(as_text=True)
    assert delivery_status(runtime, second) == "dead"  # nothing happens before the confirmation
    assert "1 deliveries skipped." in flashed(operator.post("/ops/outbox/skip", {"id": str(second), "confirm": "yes"}),
                                              operator)
    assert delivery_status(runtime, second) == "skipped"

    relay(runtime)  # the retried one dies again (max_attempts=1)
    assert "1 deliveries pending again." in flashed(operator.post("/ops/outbox/retry", {"all": "yes"}), operator)
    relay(runtime)
    assert "1 deliveries skipped." in flashed(operator.post("/ops/outbox/skip", {"all": "yes", "confirm": "yes"}),
                                              operator)
    assert delivery_status(runtime, first) == "skipped"
    assert "Not changed" in flashed(operator.post("/ops/outbox/retry", {"id": "424242"}), operator)
    assert operator.post("/ops/outbox/retry", {"id": "x"}).status_code == 400
    logged = actions_logged(runtime)
    assert ("outbox.retry", f"#{first}", "ok") in logged and ("outbox.skip", "all dead", "ok") in logged


# ---- queues ---------------------------------------------------------------------------------

def test_retried_from_the_console_then_done_shows_no_error_on_its_pages(operator, runtime, registry):
    from cronbox.outbox.engine.budget import Budget
    from cronbox.outbox.queue.jobs import job
    from cronbox.outbox.queue.worker import Worker

    tries: dict[str, int] = {}

    def once_broken(what: str) -> None:
        tries[what] = tries.get(what, 0) + 1
        if tries[what] == 1:
            raise RuntimeError(f"{what} gateway down")

    @job("mail", name="console.flaky", tries=1, registry=registry)
    def flaky(payload, ctx):
        once_broken("job")

    @consumer("order.paid", name="console.mailer", max_attempts=1, registry=registry)
    def mailer(event, ctx):
        once_broken("delivery")

    with runtime.sessions.begin() as session:
        job_id = flaky.dispatch(session, {})
        cronbox.record(session, "order.paid", {})
    Worker(runtime, ["mail"]).run(Budget(max_time=30, memory_mb=None))
    relay(runtime)
    [dead] = [d.id for d in session_rows(runtime, Delivery) if d.status == "dead"]
    assert "job gateway down" in operator.get("/ops/queues").get_data(as_text=True)
    assert "1 jobs queued again" in flashed(operator.post("/ops/queues/retry", {"id": str(job_id)}), operator)
    assert "1 deliveries pending again." in flashed(operator.post("/ops/outbox/retry", {"id": str(dead)}), operator)
    Worker(runtime, ["mail"]).run(Budget(max_time=30, memory_mb=None))
    relay(runtime)
    with runtime.sessions() as session:
        assert (session.get(Job, job_id).status, session.get(Job, job_id).last_error) == ("done", None)
        assert (session.get(Delivery, dead).status, session.get(Delivery, dead).last_error) == ("done", None)
    for page in ("/ops/queues", "/ops/outbox", "/ops/"):
        assert "gateway down" not in operator.get(page).get_data(as_text=True), page


def session_rows(runtime, model) -> list:
    with runtime.sessions() as session:
        return list(session.scalars(select(model).order_by(model.id)))


def test_queue_retry_forget_and_flush(operator, runtime):
    a, b, c = failed_job(runtime), failed_job(runtime, queue="mail", error="mailbox full"), failed_job(runtime)
    page = operator.get("/ops/queues").get_data(as_text=True)
    assert f'id="job-{a}"' in page and "RuntimeError: gateway down" in page
    with runtime.sessions() as session:
        assert session.get(Job, a).trace_id in page
    assert "+15550001111" not in page  # payloads are never shown

    assert "1 jobs queued again" in flashed(operator.post("/ops/queues/retry", {"id": str(a)}), operator)
    assert job_status(runtime, a) == "ready"
    only_mail = operator.get("/ops/queues?queue=mail").get_data(as_text=True)
    assert f'id="job-{b}"' in only_mail and f'id="job-{c}"' not in only_mail

    assert operator.post("/ops/queues/forget", {"id": str(b)}).status_code == 200  # the confirmation page
    assert job_status(runtime, b) == "failed"
    assert "1 failed jobs deleted." in flashed(operator.post("/ops/queues/forget", {"id": str(b), "confirm": "yes"}),
                                               operator)
    assert job_status(runtime, b) is None

    assert "Flush" in operator.post("/ops/queues/flush").get_data(as_text=True)
    assert job_status(runtime, c) == "failed"
    flushed = flashed(operator.post("/ops/queues/flush", {"confirm": "yes"}), operator)
    assert "Every failed job will be deleted at the next tick" in flushed
    assert job_status(runtime, c) == "failed"  # a one-off run does it, in batches, outside the request
    once_requests.run_holding_lock(runtime, main)
    assert job_status(runtime, c) is None and job_status(runtime, a) == "ready"

    d = failed_job(runtime, queue="mail")
    assert "0 jobs queued again" in flashed(operator.post("/ops/queues/retry", {"all": "yes", "queue": "sms"}),
                                            operator)
    assert "1 jobs queued again" in flashed(operator.post("/ops/queues/retry", {"all": "yes", "queue": "mail"}),
                                            operator)
    assert job_status(runtime, d) == "ready"
    assert operator.get("/ops/queues?queue=bad name!").status_code == 400
    assert [a for a, _, _ in actions_logged(runtime) if a.startswith("queue.")] == [
        "queue.retry", "queue.forget", "queue.flush", "queue.retry", "queue.retry"]


def test_batches_progress_members_by_state_retry_and_cancel(operator, runtime, registry):
    """The batches page and one batch's page read what `queue batches` / `queue batch ID` read; retry
    and cancel are the CLI's actions, CSRF-guarded POSTs recorded in the activity log."""
    @job("q", name="console.member", tries=1, registry=registry)
    def member(payload, ctx):
        if payload % 3 == 0:
            raise PermanentFailure("no such number")

    @job("slow", name="console.waiting", registry=registry)
    def waiting(payload, ctx):
        pass

    with runtime.sessions.begin() as session:
        reminders = cronbox.batch(session, name="reminders 2026-12-01", allow_failures=True)
        for n in range(7):
            member.dispatch(session, n, batch=reminders)
        export = cronbox.batch(session, name="export patient 7")
        for n in range(60):
            waiting.dispatch(session, n, batch=export)
    Worker(runtime, ["q"]).run(Budget(max_time=60, memory_mb=None))

    listing = operator.get("/ops/batches").get_data(as_text=True)
    assert f'id="batch-{reminders.id}"' in listing and f'id="batch-{export.id}"' in listing
    assert "reminders 2026-12-01" in listing and "finished" in listing and "running" in listing
    page = operator.get(f"/ops/batches/{reminders.id}").get_data(as_text=True)
    assert "done 4, failed 3, cancelled 0, pending 0 of 7" in page
    failed = operator.get(f"/ops/batches/{reminders.id}?state=failed").get_data(as_text=True)
    assert failed.count('id="member-') == 3 and "PermanentFailure: no such number" in failed
    assert operator.get(f"/ops/batches/{reminders.id}?state=done").get_data(as_text=True).count('id="member-') == 4
    assert operator.get(f"/ops/batches/{reminders.id}?state=gone").status_code == 400
    assert operator.get("/ops/batches/987654").status_code == 404
    seen, path = [], f"/ops/batches/{export.id}?state=ready"  # keyset-paged, as every long list
    while path:
        html = operator.get(path).get_data(as_text=True)
        seen += re.findall(r'id="member-(\d+)"', html)
        older = re.search(r'<a href="(/ops/batches/\d+\?[^"]+)">Older', html)
        path = older.group(1).replace("&amp;", "&") if older else None
    assert len(seen) == len(set(seen)) == 60

    retried = flashed(operator.post("/ops/batches/retry", {"id": str(reminders.id)}), operator)
    assert "3 failed members of batch" in retried and "running" in retried
    assert operator.post("/ops/batches/cancel", {"id": str(export.id)}).status_code == 200  # the confirmation
    cancelled = flashed(operator.post("/ops/batches/cancel", {"id": str(export.id), "confirm": "yes"}), operator)
    assert f"Batch {export.id} cancelled; 60 members not started stopped." in cancelled
    assert "cancelled 60, pending 0 of 60" in cancelled
    again = flashed(operator.post("/ops/batches/cancel", {"id": str(export.id), "confirm": "yes"}), operator)
    assert "nothing to cancel" in again
    assert operator.post("/ops/batches/retry", {"id": "x"}).status_code == 400
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(
            Job.batch_id == reminders.id, Job.status == "ready")) == 3
    assert [(a, t, o) for a, t, o in actions_logged(runtime) if a.startswith("batch.")] == [
        ("batch.retry", f"batch #{reminders.id}", "ok"), ("batch.cancel", f"batch #{export.id}", "ok"),
        ("batch.cancel", f"batch #{export.id}", "not-running")]
    assert "batch.cancel" in operator.get("/ops/activity").get_data(as_text=True)


def test_the_queues_page_shows_concurrency_groups_and_cost_budgets(runtime, env):
    from cronbox.outbox.queue import groups
    from cronbox.outbox.queue.jobs import job

    app = make_app(env, runtime, CRONBOX_QUEUE_BUDGETS="sms=50/m")
    try:
        registry = app.extensions["cronbox"].runtime.registry
        job("sms", name="provider.send", concurrency_group="providers", concurrency_limit=3,
            registry=registry)(lambda payload, ctx: None)
        now = clock.utcnow()
        with runtime.sessions.begin() as session:
            session.add(Job(queue="sms", handler="provider.send", payload="{}", status="ready", available_at=now,
                            trace_id="j" * 32, created_at=now))
            groups.take(session, "providers", 3, "h", now + timedelta(minutes=5), now)
            groups.budgets(app.extensions["cronbox"].runtime.settings)[("queue", "sms")].charge(session, 20, now)
        page = logged_in(app).get("/ops/queues").get_data(as_text=True)
    finally:
        app.extensions["cronbox"].runtime.dispose()
    row = re.search(r'<tr id="group-providers">(.*?)</tr>', page, re.S).group(1)
    assert re.findall(r'<td[^>]*>([^<]*)</td>', row) == ["providers", "3", "1", "1"]
    budget = re.search(r'<tr id="budget-queue-sms">(.*?)</tr>', page, re.S).group(1)
    assert re.findall(r'<td[^>]*>([^<]*)</td>', budget)[:4] in (["queue sms", "20", "50", "60 s"],
                                                                 ["queue sms", "0", "50", "60 s"])  # a minute turned


def test_paused_channels_are_shown_and_resumed(operator, runtime):
    with clock.frozen(T0):
        with runtime.sessions.begin() as session:
            pauses.pause(session, "sms", 900, "Kavenegar 418: out of credit", T0)
            held = outbox.channels.send_sms.dispatch(session, {"to": "+15550001111", "text": "code 4711"})
            session.execute(Job.__table__.update().where(Job.id == held)  # as the worker leaves a held job
                            .values(available_at=T0 + timedelta(seconds=900), reserved_at=T0))
        page = operator.get("/ops/queues").get_data(as_text=True)
        assert 'id="paused-sms"' in page and "Kavenegar 418: out of credit" in page
        assert "2026-11-30 12:15:00 UTC" in page and 'aria-label="Resume channel sms"' in page

        assert operator.post("/ops/queues/resume", {"channel": "sms"}, csrf=False).status_code == 400
        assert operator.post("/ops/queues/resume", {"channel": "sms", "csrf_token": "forged"},
                             csrf=False).status_code == 400
        with runtime.sessions() as session:
            assert session.get(ChannelPause, "sms") is not None
        resumed = flashed(operator.post("/ops/queues/resume", {"channel": "sms"}), operator)
        assert "Channel sms resumed; 1 waiting jobs run at the next tick." in resumed
        assert 'id="paused-sms"' not in resumed
        with runtime.sessions() as session:
            assert session.get(ChannelPause, "sms") is None
            assert session.get(Job, held).available_at == T0
        again = flashed(operator.post("/ops/queues/resume", {"channel": "sms"}), operator)
        assert "Channel sms is not paused." in again
        for bad in ({}, {"channel": ""}, {"channel": "x" * 33}):
            assert operator.post("/ops/queues/resume", bad).status_code == 400
    assert [a for a in actions_logged(runtime) if a[0] == "queue.resume"] == [
        ("queue.resume", "sms", "ok"), ("queue.resume", "sms", "not-paused")]


# ---- schedule and one-off runs --------------------------------------------------------------

def test_schedule_run_now_and_one_off_requests(operator, runtime):
    page = operator.get("/ops/schedule").get_data(as_text=True)
    assert "cronbox.prune" in page and "cronbox.health" in page
    response = operator.post("/ops/schedule/run", {"task": "cronbox.health"})
    assert "cronbox.health will run at the next tick" in flashed(response, operator)
    assert operator.post("/ops/schedule/run", {"task": "no.such.task"}).status_code == 400

    assert "is pending" in flashed(operator.post("/ops/once", {"command": "python -m cronbox migrate"}), operator)
    refused = flashed(operator.post("/ops/once", {"command": "demo --count 5"}), operator)
    assert "Not queued" in refused and "not allowed" in refused
    assert "Not queued" in flashed(operator.post("/ops/once", {"command": "migrate 'unclosed"}), operator)
    assert operator.post("/ops/once", {"command": "x" * 501}).status_code == 400
    with runtime.sessions() as session:
        rows = session.scalars(select(OnceRequest).order_by(OnceRequest.id)).all()
    assert [(r.argv, r.source, r.status) for r in rows] == [
        ('["schedule", "run", "cronbox.health"]', "console:operator", "pending"),
        ('["migrate"]', "console:operator", "pending")]
    once_requests.run_holding_lock(runtime, main)
    detail = operator.get(f"/ops/once/{rows[1].id}").get_data(as_text=True)
    assert 'id="exit-code">0<' in detail and "migrate" in detail
    assert operator.get("/ops/once/999999").status_code == 404
    listing = operator.get("/ops/once").get_data(as_text=True)
    assert f'id="once-{rows[0].id}"' in listing and f'id="once-{rows[1].id}"' in listing
    assert ("once.add", "demo --count", "refused") in actions_logged(runtime)


# ---- files ----------------------------------------------------------------------------------

def test_files_audit_filters_revoke_and_no_phi_in_the_page(operator, runtime):
    store = operator.app.extensions["cronbox"].storage
    with runtime.sessions.begin() as session:
        file_id = store.put(session, io.BytesIO(b"%PDF secret result"), filename="HIV-result-Jane-Doe.pdf",
                            content_type="application/pdf", owner="patient:42")
        grant_id = store.grant(session, file_id, "doctor:7", expires_in=3600)
        other_grant = store.grant(session, file_id, "nurse:9", expires_in=3600)
    url = store.signed_url(grant_id, ttl=300)
    path = urlsplit(url).path
    assert operator.client.get(path).status_code == 200
    assert operator.client.get(path[:-3] + "xyz").status_code == 404  # a tampered link: audited refusal

    page = operator.get("/ops/files").get_data(as_text=True)
    for secret in ["HIV-result-Jane-Doe", "%PDF", path.rsplit("/", 1)[-1], PASSWORD,
                   credentials.password_hash(operator.app.extensions["cronbox"].settings),
                   operator.client.get_cookie("cronbox_ops", path="/ops").value]:
        assert secret not in page
    assert grant_id in page and "doctor:7" in page and file_id in page

    by_subject = operator.get("/ops/files?subject=doctor:7").get_data(as_text=True)
    assert grant_id in by_subject and other_grant not in by_subject
    refused = operator.get("/ops/files?outcome=ok&subject=nurse:9").get_data(as_text=True)
    assert "No audit entries match" not in refused  # the grant entry
    assert "No audit entries match" in operator.get("/ops/files?outcome=nothing-like-this").get_data(as_text=True)
    assert operator.get("/ops/files?file=" + "f" * 300).status_code == 400

    assert "Revoke grant" in operator.post("/ops/files/revoke", {"grant": grant_id}).get_data(as_text=True)
    assert "revoked." in flashed(operator.post("/ops/files/revoke", {"grant": grant_id, "confirm": "yes"}), operator)
    assert operator.client.get(path).status_code == 404  # the link stops working at once
    assert "already revoked" in flashed(operator.post("/ops/files/revoke", {"grant": grant_id, "confirm": "yes"}),
                                        operator)
    assert "No grant" in flashed(operator.post("/ops/files/revoke", {"grant": "zz", "confirm": "yes"}), operator)
    with runtime.sessions() as session:
        assert session.get(Grant, grant_id).revoked_at is not None
        entry = session.scalars(select(AuditEntry).where(AuditEntry.action == "revoke")).one()
        assert entry.detail == "by operator"
    assert ("files.revoke", grant_id, "ok") in actions_logged(runtime)
    assert ("files.revoke", grant_id, "already-revoked") in actions_logged(runtime)


def test_file_names_only_when_the_operator_may_see_them(runtime, env):
    application = make_app(env, runtime, CRONBOX_OPS_SHOW_FILE_NAMES="on")
    try:
        operator = logged_in(application)
        store = application.extensions["cronbox"].storage
        with runtime.sessions.begin() as session:
            file_id = store.put(session, io.BytesIO(b"x"), filename="scan-0042.pdf", content_type="application/pdf",
                                owner="patient:42")
            store.grant(session, file_id, "doctor:7")
        assert "scan-0042.pdf" in operator.get("/ops/files").get_data(as_text=True)
    finally:
        application.extensions["cronbox"].runtime.dispose()


@pytest.mark.parametrize("show", ["on", "off"])
def test_each_file_name_shown_is_audited_and_none_is_unsealed_when_names_are_hidden(runtime, env, show):
    """Names used to be unsealed for the page with no audit entry."""
    application = make_app(env, runtime, CRONBOX_OPS_SHOW_FILE_NAMES=show, CRONBOX_TRUSTED_PROXIES="1")
    store = application.extensions["cronbox"].storage
    unsealed: list[str] = []
    describe = store.describe
    store.describe = lambda row: unsealed.append(row.id) or describe(row)  # counts unsealing, on this instance
    try:
        operator = logged_in(application, HTTP_X_FORWARDED_FOR="203.0.113.8", HTTP_USER_AGENT="Firefox/140")
        with runtime.sessions.begin() as session:
            ids = [store.put(session, io.BytesIO(b"x"), filename=f"scan-{n}.pdf", content_type="application/pdf",
                             owner=f"patient:{n}") for n in range(4)]
            for file_id in ids[:3]:
                store.grant(session, file_id, "doctor:7")
        with runtime.sessions() as session:
            before = session.scalar(select(func.max(AuditEntry.id)))
        page = operator.get("/ops/files").get_data(as_text=True)
        with runtime.sessions() as session:
            shown_rows = list(session.scalars(select(AuditEntry).where(AuditEntry.id > before)))
    finally:
        application.extensions["cronbox"].runtime.dispose()
    if show == "off":
        assert unsealed == [] and shown_rows == [] and "scan-0.pdf" not in page
        return
    assert sorted(unsealed) == sorted(ids)  # the files named by the page's audit entries and grants
    assert sorted((r.action, r.outcome, r.file_id, r.subject) for r in shown_rows) == sorted(
        ("show-name", "ok", file_id, f"patient:{n}") for n, file_id in enumerate(ids))
    assert {(r.detail, r.client_ip, r.user_agent) for r in shown_rows} == {("by operator", "203.0.113.8", "Firefox/140")}
    assert all(f"scan-{n}.pdf" in page for n in range(4))


def test_long_lists_are_paged_by_key(operator, runtime):
    with runtime.sessions.begin() as session:
        for n in range(120):
            audit.record(session, "redeem", "bad-token", status=404, subject=f"s{n % 3}")
    seen, path, pages = [], "/ops/files", 0
    while path:
        page = operator.get(path).get_data(as_text=True)
        seen += re.findall(r'<td><a href="/ops/files\?subject=(s\d)">', page)
        older = re.search(r'<a href="(/ops/files\?after=[^"]+)">Older', page)
        path = older.group(1).replace("&amp;", "&") if older else None
        pages += 1
    assert pages == 3 and len(seen) == 120
    by_subject = operator.get("/ops/files?subject=s1").get_data(as_text=True)
    assert by_subject.count('href="/ops/files?subject=s1"') == 40
    assert operator.get("/ops/files?after=not-a-cursor").status_code == 400
    assert operator.get("/ops/activity?after=1~2").status_code == 400


def test_every_action_lands_in_the_activity_page(operator, runtime):
    failed = failed_job(runtime)
    operator.post("/ops/queues/retry", {"id": str(failed)})
    page = operator.get("/ops/activity").get_data(as_text=True)
    assert "queue.retry" in page and f"#{failed}" in page and "setup" in page
    with runtime.sessions() as session:
        rows = session.scalars(select(OperatorAction)).all()
    assert all(r.operator == "operator" and r.at is not None for r in rows)


def test_retention_prunes_ended_sessions_and_old_actions(app, runtime):
    from cronbox.cron.scheduling.retention import prune_ops

    with clock.frozen(T0):
        logged_in(app)  # one session, two actions (setup, and its login)
        clock.advance(2 * 3600 + 1)
        fresh = Operator(app)
        assert fresh.log_in().status_code == 303
        counts = prune_ops(runtime)
        assert counts["console sessions"] == 1 and counts["console actions"] == 0
        clock.advance(runtime.settings.audit_retention_days * 86400 + 1)
        counts = prune_ops(runtime)
        assert counts["console sessions"] == 1 and counts["console actions"] == 2
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(OperatorSession)) == 0


def test_logout_everywhere_ends_every_session(app, runtime):
    first = logged_in(app)
    second = Operator(app)
    assert second.log_in().status_code == 303
    assert "Log out every session" in first.get("/ops/activity").get_data(as_text=True)
    response = first.post("/ops/logout-everywhere", page="/ops/activity")
    assert response.status_code == 303 and response.headers["Location"] == "/ops/login"
    assert first.get("/ops/").status_code == 302 and second.get("/ops/").status_code == 302
    assert ("logout-everywhere", None, "ok") in actions_logged(runtime)


# ---- bad input never crashes ------------------------------------------------------------------

def test_out_of_range_numbers_and_odd_query_keys_are_refused_cleanly(operator, runtime):
    huge = "9" * 25
    assert operator.get(f"/ops/activity?after={huge}").status_code == 400
    assert operator.get(f"/ops/once/{huge}").status_code == 404
    for path in ("/ops/outbox/retry", "/ops/queues/retry", "/ops/queues/forget"):
        assert operator.post(path, {"id": huge, "confirm": "yes"}).status_code == 400, path
    assert operator.post("/ops/files/revoke", {"grant": "g" * 65, "confirm": "yes"}).status_code == 400
    with runtime.sessions.begin() as session:
        for _ in range(60):
            audit.record(session, "redeem", "bad-token", status=404)
    page = operator.get("/ops/files?endpoint=x&_external=1&outcome=bad-token").get_data(as_text=True)
    older = re.search(r'<a href="([^"]+)">Older', page).group(1).replace("&amp;", "&")
    assert "endpoint=x" in older and "_external=1" in older and "outcome=bad-token" in older
    assert operator.get(older).status_code == 200
    assert operator.get("/ops/static/ops.css").headers.get("Cache-Control") != "no-store"


def test_next_with_control_characters_or_dot_segments_goes_to_the_overview(app):
    browser = Operator(app)
    browser.set_up()
    for target in ["/ops/\r\nX-Evil: 1", "/ops/../../etc", "/ops/./queues", "/ops/queues\x7f"]:
        response = browser.client.post("/ops/login", data={"csrf_token": browser.token(), "password": PASSWORD,
                                                           "next": target})
        assert response.status_code == 303 and response.headers["Location"] == "/ops/", target


def test_skip_all_only_takes_what_was_dead_when_confirmed(operator, runtime, registry):
    first, second = dead_deliveries(runtime, registry)
    ask = operator.post("/ops/outbox/skip", {"all": "yes"}).get_data(as_text=True)
    upto = re.search(r'name="upto" value="(\d+)"', ask).group(1)
    assert int(upto) == second
    with runtime.sessions.begin() as session:  # one more dies after the operator looked
        cronbox.record(session, "order.paid", {"n": 9})
    relay(runtime)
    later = max(dead_deliveries_ids(runtime))
    response = operator.post("/ops/outbox/skip", {"all": "yes", "upto": upto, "confirm": "yes"})
    assert "2 deliveries skipped." in flashed(response, operator)
    assert delivery_status(runtime, later) == "dead"


def dead_deliveries_ids(runtime) -> list[int]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Delivery.id).where(Delivery.status == "dead")))


def test_destructive_one_off_commands_ask_first(operator, runtime):
    ask = operator.post("/ops/once", {"command": "queue flush"})
    assert ask.status_code == 200 and "Queue it" in ask.get_data(as_text=True)
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(OnceRequest)) == 0
    assert "is pending" in flashed(operator.post("/ops/once", {"command": "queue flush", "confirm": "yes"}), operator)
    assert "is pending" in flashed(operator.post("/ops/once", {"command": "queue retry --all"}), operator)


def test_a_password_changed_elsewhere_ends_older_sessions(operator):
    settings = operator.app.extensions["cronbox"].settings
    assert operator.get("/ops/").status_code == 200
    credentials.store_password(settings, "changed from the command line", replace=True)  # `ops set-password`
    assert operator.get("/ops/").status_code == 302
    again = Operator(operator.app)
    assert again.log_in("changed from the command line").status_code == 303
    credentials.hash_file(settings).unlink()  # deleted in File Manager to start over
    assert again.get("/ops/").status_code == 302


def test_two_column_pages_walk_every_row_once_even_with_ties(operator, runtime):
    """Failed jobs and dead deliveries page on (time, id) newest first; 130 rows, many failing in the
    same microsecond, must each appear exactly once across the pages (MariaDB forces the index)."""
    from cronbox.outbox.events.models import OutboxEvent

    moments = [T0 + timedelta(seconds=n // 7) for n in range(130)]  # seven rows share each time: pages split them
    with runtime.sessions.begin() as session:
        for n, moment in enumerate(moments):
            session.add(Job(queue="sms" if n % 2 else "mail", handler="h", payload="{}", status="failed",
                            attempts=1, trace_id="t", created_at=moment, finished_at=moment, last_error="x"))
            event = OutboxEvent(type="t", key=None, payload="{}", trace_id="t", created_at=moment,
                                available_at=moment, fanned_out_at=moment)
            session.add(event)
            session.flush()
            session.add(Delivery(event_id=event.id, consumer="c", key=None, status="dead", attempts=1,
                                 next_attempt_at=moment, created_at=moment, finished_at=moment))
    for path, row_id in (("/ops/queues", r'id="job-(\d+)"'), ("/ops/outbox", r'id="delivery-(\d+)"')):
        seen, pages, next_path = [], 0, path
        while next_path:
            page = operator.get(next_path).get_data(as_text=True)
            seen += [int(i) for i in re.findall(row_id, page)]
            older = re.search(r'<p class="pager"><a href="([^"]+)">Older', page)
            next_path = older.group(1).replace("&amp;", "&") if older else None
            pages += 1
        assert pages == 3 and len(seen) == 130 and len(set(seen)) == 130, path


def test_upload_from_the_files_page_needs_the_session_and_its_token(operator, runtime):
    """Under the console's own path, where its cookie goes (POST /files never sees that cookie)."""
    page = operator.get("/ops/files").get_data(as_text=True)
    action, token = upload_form(page)
    assert action == "/ops/upload"

    def form(sent: str | None = token):
        return {**({"csrf_token": sent} if sent else {}), "owner": "patient:77",
                "file": (io.BytesIO(b"%PDF x-ray"), "x-ray of Jane.pdf")}

    response = operator.client.post(action, data=form(), content_type="multipart/form-data")
    assert response.status_code == 303 and response.headers["Location"].startswith("/ops/files?file=")
    file_id = response.headers["Location"].rsplit("=", 1)[1]
    shown = operator.get(response.headers["Location"]).get_data(as_text=True)
    assert f"Sealed as file {file_id}." in shown and "x-ray of Jane" not in shown
    store = operator.app.extensions["cronbox"].storage
    with runtime.sessions() as session:
        row = session.get(SealedFile, file_id)
        assert row.owner == "patient:77" and store.describe(row)[0] == "x-ray of Jane.pdf"
        put = session.scalars(select(AuditEntry).where(AuditEntry.action == "put")).one()
        assert put.detail.endswith("by operator")
    assert ("files.upload", file_id, "ok") in actions_logged(runtime)

    refused = operator.client.post(action, data={"csrf_token": token, "file": (io.BytesIO(b"x"), "a.pdf")},
                                   content_type="multipart/form-data")  # no owner
    assert refused.status_code == 303 and "Upload refused" in flashed(refused, operator)
    for bad in [None, "forged"]:  # a session alone, a forged token: no
        assert operator.client.post(action, data=form(bad), content_type="multipart/form-data").status_code == 400
    # The token in the URL (where access logs keep it) is not looked at: refused as missing.
    assert operator.client.post(f"{action}?csrf_token={token}", data=form(None),
                                content_type="multipart/form-data").status_code == 400
    stranger = Operator(operator.app)  # a token without the session: no
    assert stranger.client.post(action, data=form(), content_type="multipart/form-data").status_code == 400
    elsewhere = operator.client.post("/files", data=form(), content_type="multipart/form-data")
    assert elsewhere.status_code == 404  # POST /files knows no operator (and no upload token is set here)
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(SealedFile)) == 1


def test_queues_shows_handler_profiles_and_the_last_pools(operator, runtime):
    now = clock.utcnow()
    with runtime.sessions.begin() as session:
        session.add(HandlerProfile(kind="job", handler="report.<b>big</b>", runs=4, duration_ms=1500, rss_growth_kb=61440,
                                   samples=json.dumps([[epoch(now), 1500, 61440]]), updated_at=now,
                                   never_fits="grows RSS by 60 MB, more than --memory 64 MB minus 8 MB headroom",
                                   never_fits_at=now))
        session.add(Heartbeat(command="pool", host="h", pid=1, started_at=now, finished_at=now, outcome="empty",
                              detail="workers 3 (peak 3), started 4, restarts 1, jobs 40 done, 0 failed"))
    page = operator.get("/ops/queues").get_data(as_text=True)
    assert "Handler profiles" in page and "report.&lt;b&gt;big&lt;/b&gt;" in page and "<b>big" not in page
    assert "60.0" in page and "1500" in page and "more than --memory 64 MB" in page
    assert "Worker pools" in page and "restarts 1" in page


URL_ATTRIBUTE = re.compile(r'(?:href|action|src)="([^"]*)"')


def test_no_page_puts_a_token_in_a_url_and_a_token_after_the_file_is_not_seen(operator, runtime):
    """Issue 24: access logs keep URLs, so no CSRF token rides in one; the upload's is its first field."""
    token = operator.token("/ops/files")
    for page in [*GET_PAGES, "/ops/login"]:
        html = operator.get(page).get_data(as_text=True)
        urls = URL_ATTRIBUTE.findall(html)
        assert urls and [u for u in urls if "csrf" in u.lower() or token in u] == [], page
    late = operator.client.post("/ops/upload", content_type=FORM, data=form(
        part("owner", b"patient:1"), part("file", b"%PDF", filename="a.pdf"), part("csrf_token", token.encode())))
    assert late.status_code == 400
    first = operator.client.post("/ops/upload", content_type=FORM, data=form(
        part("csrf_token", token.encode()), part("owner", b"patient:1"), part("file", b"%PDF", filename="a.pdf")))
    assert first.status_code == 303
    header = operator.client.post("/ops/upload", content_type="multipart/form-data", headers={"X-CSRF-Token": token},
                                  data={"owner": "patient:1", "file": (io.BytesIO(b"%PDF"), "a.pdf")})
    assert header.status_code == 303  # a script's header instead of the field
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(SealedFile)) == 2
