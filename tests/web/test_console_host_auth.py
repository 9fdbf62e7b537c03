"""The host's own login guards the console and browser uploads (issue 16): `console_operator` / `upload_operator`.

The host is a real Flask-Login app with a staff flag on its users. Staff reach the console under
their own identity; others and anonymous visitors get cronbox's refusal (or the host's login page
when it names one), never cronbox's password page; the console's forms still need its own CSRF
token, destructive actions their confirmation, and every action lands in the activity log with the
staff user's identity and address. Logging out of the host closes the console at the next request;
a hook that raises is a 403 logged once. On SQLite and MariaDB.
"""
from __future__ import annotations

import io
import logging
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from flask import Flask, abort, jsonify, redirect, request, session
from flask_login import LoginManager, UserMixin, current_user, login_user, logout_user
from sqlalchemy import select

from cronbox.web.ops import guard
from cronbox.outbox.core import clock

import cronbox
from cronbox.cron.operator.models import OperatorAction, OperatorSession
from cronbox import Cronbox
from cronbox.outbox.core.settings import load_settings
from cronbox.storage.models import AuditEntry, SealedFile
from tests.console_helpers import CSRF, GET_PAGES, csrf_token, upload_form
from tests.web.test_console import dead_deliveries, delivery_status

# The host app's login and form handling: the server behind the rows changes nothing, so not PostgreSQL
# too (.ci/run's 30 minutes; storage rows are tested on it by test_storage_http and test_storage_hardening).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

STAFF_IP = "198.51.100.7"


class User(UserMixin):
    def __init__(self, name: str, staff: bool):
        self.id, self.staff = name, staff


USERS = {"alice": User("alice", staff=True), "bob": User("bob", staff=False)}


def staff_only(req) -> str | None | bool:
    """The host's hook, as the README shows it: None for nobody signed in, False for a user who may not."""
    if not current_user.is_authenticated:
        return None
    return f"staff:{current_user.id}" if current_user.staff else False


def clinic(root: Path) -> Flask:
    app = Flask("clinic", root_path=str(root))
    app.config.update(SECRET_KEY="the clinic's own secret key", TESTING=True)
    logins = LoginManager(app)
    logins.user_loader(USERS.get)

    @app.get("/sign-in/<name>")
    def sign_in(name: str):
        login_user(USERS[name])
        return "signed in"

    @app.get("/sign-out")
    def sign_out():
        logout_user()
        return "signed out"

    @app.get("/login")
    def login_page():  # the usual login view: whoever is signed in already goes on to `next`
        if current_user.is_authenticated:
            return redirect(request.args.get("next") or "/")
        return "the clinic's login page"

    @app.get("/session")
    def host_session():
        return jsonify(sorted(session.keys()))

    return app


@pytest.fixture
def make(runtime, env, tmp_path):
    def make(**hooks) -> Flask:
        (tmp_path / "clinic").mkdir(exist_ok=True)
        app = clinic(tmp_path / "clinic")
        Cronbox().init_app(app, settings=load_settings(environ=env), **hooks).use_runtime(runtime)
        return app
    return make


def browser(app, name: str | None = None, **environ):
    client = app.test_client()
    client.environ_base.update({"REMOTE_ADDR": STAFF_IP, **environ})
    if name:
        assert client.get(f"/sign-in/{name}").status_code == 200
    return client


def token(client, page: str = "/ops/once") -> str:
    return csrf_token(client.get(page).get_data(as_text=True))


def logged_actions(runtime) -> list[tuple[str, str, str | None, str | None]]:
    with runtime.sessions() as s:
        return [(a.operator, a.action, a.target, a.client_ip)
                for a in s.scalars(select(OperatorAction).order_by(OperatorAction.id))]


def test_staff_reach_the_console_others_are_refused_and_never_see_the_password_page(make, runtime):
    app = make(console_operator=staff_only, console_logout_url="/sign-out")
    staff = browser(app, "alice")
    for path in GET_PAGES:
        page = staff.get(path)
        assert page.status_code in (200, 404), path  # /ops/once/1: no such run yet
        text = page.get_data(as_text=True)
        assert "password" not in text.lower() and 'href="/sign-out"' in text, path
    assert 'action="/ops/logout"' not in staff.get("/ops/").get_data(as_text=True)
    assert "Log out every session" not in staff.get("/ops/activity").get_data(as_text=True)
    # cronbox's own login, setup and logout are not offered at all.
    for path in ["/ops/login", "/ops/setup"]:
        assert staff.get(path).status_code == 404, path
    for path in ["/ops/logout", "/ops/logout-everywhere"]:
        assert staff.post(path, data={"csrf_token": token(staff)}).status_code == 404, path

    for who in [browser(app, "bob"), browser(app)]:
        for path in [*GET_PAGES, "/ops/login", "/ops/setup", "/ops/no-such-page"]:
            refused = who.get(path)
            text = refused.get_data(as_text=True)
            assert refused.status_code == 403 and "Not allowed" in text, path
            assert "password" not in text.lower() and "csrf_token" not in text, path
        posted = who.post("/ops/once", data={"command": "migrate", "csrf_token": token(staff)})
        assert posted.status_code == 403
    assert browser(app).get("/ops/static/ops.css").status_code == 200  # the refusal page's stylesheet
    with runtime.sessions() as s:
        assert s.scalars(select(OperatorSession)).first() is None  # no cronbox session was ever made
    # cronbox wrote nothing into the host's session: only what Flask-Login itself keeps.
    assert "cronbox" not in " ".join(staff.get("/session").json)
    for path in ["/ops/", "/ops/once", "/ops/activity"]:
        cookies = {h.split("=", 1)[0] for h in staff.get(path).headers.getlist("Set-Cookie")}
        assert cookies <= {"cronbox_ops"}, path


def test_a_refused_browser_goes_to_the_hosts_login_with_a_safe_next(make):
    app = make(console_operator=staff_only, console_login_url="/login?from=console")
    anonymous = browser(app)
    sent = anonymous.get("/ops/queues?queue=sms")
    assert sent.status_code == 302
    where = urlsplit(sent.headers["Location"])
    assert where.path == "/login" and parse_qs(where.query) == {"from": ["console"], "next": ["/ops/queues?queue=sms"]}
    for path in ["/ops//evil.example/", "/ops/%5C%5Cevil.example"]:
        location = anonymous.get(path).headers.get("Location", "")
        next_path = parse_qs(urlsplit(location).query).get("next", ["/"])[0]
        assert next_path.startswith("/") and not next_path.startswith(("//", "/\\")), path
    # A POST is refused, never redirected (a form's body would be lost); non-staff get the same door.
    assert anonymous.post("/ops/once", data={"command": "migrate"}).status_code == 403
    assert browser(app, "bob").get("/ops/").status_code == 403  # signed in, not staff: never the login
    # A callable decides the whole URL, e.g. Flask-Login's login_url().
    app = make(console_operator=staff_only, console_login_url=lambda next_path: f"/login?back={next_path}")
    assert browser(app).get("/ops/files").headers["Location"] == "/login?back=/ops/files"


@pytest.mark.parametrize("path", ["/ops/", "/ops/files?file=ab", "/ops/queues"])
def test_a_signed_in_user_who_may_not_gets_the_403_page_not_a_loop_through_the_login(make, path, caplog):
    """With console_login_url and the usual "signed in already: go to next" login view, a signed-in
    non-staff user used to be sent to the login, back to the console, and so on for ever."""
    app = make(console_operator=staff_only, console_login_url="/login", upload_operator=staff_only)
    bob = browser(app, "bob")
    refused = bob.get(path)
    assert refused.status_code == 403 and "Location" not in refused.headers
    assert "hook raised" not in caplog.text  # False is an answer, not a failing hook
    assert "Not allowed" in refused.get_data(as_text=True)
    followed = bob.get(path, follow_redirects=True)
    assert followed.status_code == 403 and len(followed.history) == 0
    assert bob.post("/ops/upload", data={}).status_code == 403  # the console's upload route too
    sent = browser(app).get(path)
    assert sent.status_code == 302 and urlsplit(sent.headers["Location"]).path == "/login"
    assert browser(app).get(path, follow_redirects=True).get_data(as_text=True) == "the clinic's login page"
    # Signing in as staff on the login page's way back gets in.
    alice = browser(app, "alice")
    landed = alice.get(path, follow_redirects=True)
    assert landed.status_code in (200, 404) and "Not allowed" not in landed.get_data(as_text=True)



@pytest.mark.parametrize("path", ["/ops/", "/ops/outbox"])
def test_a_hook_answering_none_for_a_signed_in_user_ends_on_the_403_page_not_a_loop(make, path):
    """The hook of before (None for everyone refused): the login view sends a signed-in user straight
    back; refused again within moments, the browser gets the 403 page instead of the login again."""
    app = make(console_operator=lambda req: staff_only(req) or None, console_login_url="/login")
    bob = browser(app, "bob")
    followed = bob.get(path, follow_redirects=True)
    assert followed.status_code == 403 and len(followed.history) == 2  # console -> login -> console: 403
    assert followed.history[0].status_code == 302 and followed.history[1].status_code == 302
    assert browser(app).get(path, follow_redirects=True).get_data(as_text=True) == "the clinic's login page"
    anonymous = browser(app)
    assert anonymous.get(path).status_code == 302
    assert anonymous.get(path).status_code == 403  # back at once, still nobody: no second round trip
    assert anonymous.get("/sign-in/alice").status_code == 200
    assert anonymous.get(path).status_code in (200, 404)  # signed in as staff after all: in
    anonymous.get("/sign-out")
    assert anonymous.get(path).status_code == 302  # in once: a later refusal may go to the login again
    later = browser(app, "bob")
    assert later.get(path).status_code == 302
    with clock.frozen(clock.utcnow() + timedelta(seconds=guard.LOGIN_ROUND_TRIP + 1)):
        assert later.get(path).status_code == 302  # long after: the login again


def test_forms_need_the_consoles_own_token_bound_to_the_visit_and_the_staff_user(make, runtime, registry):
    app = make(console_operator=staff_only)
    dead = dead_deliveries(runtime, registry, count=1)[0]
    staff = browser(app, "alice")
    page_token = token(staff)
    other_visit = browser(app, "alice")
    for form in [{}, {"csrf_token": "forged"}, {"csrf_token": token(other_visit)}]:
        refused = staff.post("/ops/outbox/retry", data={"id": str(dead), **form})
        assert refused.status_code == 400 and "Form refused" in refused.get_data(as_text=True), form
    # The same browser, another staff user signed in: the token made for alice is not carol's.
    USERS["carol"] = User("carol", staff=True)
    try:
        assert staff.get("/sign-in/carol").status_code == 200
        assert staff.post("/ops/outbox/retry", data={"id": str(dead), "csrf_token": page_token}).status_code == 400
        assert staff.get("/sign-in/alice").status_code == 200
    finally:
        del USERS["carol"]
    assert delivery_status(runtime, dead) == "dead"
    retried = staff.post("/ops/outbox/retry", data={"id": str(dead), "csrf_token": page_token})
    assert retried.status_code == 303 and delivery_status(runtime, dead) == "pending"
    assert "1 deliveries pending again." in staff.get("/ops/outbox").get_data(as_text=True)  # the flash


def test_actions_are_logged_with_the_staff_identity_and_ip_and_destructive_ones_still_ask(make, runtime, registry):
    app = make(console_operator=staff_only, upload_operator=staff_only)
    dead = dead_deliveries(runtime, registry, count=1)[0]
    staff = browser(app, "alice")
    ask = staff.post("/ops/outbox/skip", data={"id": str(dead), "csrf_token": token(staff)})
    assert ask.status_code == 200 and 'name="confirm" value="yes"' in ask.get_data(as_text=True)
    assert delivery_status(runtime, dead) == "dead"  # nothing before the confirmation
    confirmed = staff.post("/ops/outbox/skip", data={"id": str(dead), "confirm": "yes",
                                                    "csrf_token": csrf_token(ask.get_data(as_text=True))})
    assert confirmed.status_code == 303 and delivery_status(runtime, dead) == "skipped"

    # A grant revoked from the Files page: the action log and the file audit both name alice.
    st = app.extensions["cronbox"].storage
    with runtime.sessions.begin() as s:
        file_id = st.put(s, io.BytesIO(b"%PDF scan"), filename="scan.pdf", content_type="application/pdf",
                         owner="patient:3")
    with runtime.sessions.begin() as s:
        grant = st.grant(s, file_id, "patient:3")
    revoke = {"grant": grant, "confirm": "yes"}
    assert staff.post("/ops/files/revoke", data={**revoke, "csrf_token": token(staff, "/ops/files")}).status_code == 303
    assert ("staff:alice", "outbox.skip", f"#{dead}", STAFF_IP) in logged_actions(runtime)
    assert ("staff:alice", "files.revoke", grant, STAFF_IP) in logged_actions(runtime)
    with runtime.sessions() as s:
        details = list(s.scalars(select(AuditEntry.detail).where(AuditEntry.action == "revoke")))
    assert details == ["by staff:alice"]
    page = staff.get("/ops/activity").get_data(as_text=True)
    assert "staff:alice" in page and STAFF_IP in page


def test_logging_out_of_the_host_closes_the_console_at_once(make):
    app = make(console_operator=staff_only)
    staff = browser(app, "alice")
    held = token(staff)
    assert staff.get("/ops/queues").status_code == 200
    assert staff.get("/sign-out").status_code == 200
    assert staff.get("/ops/queues").status_code == 403
    assert staff.post("/ops/once", data={"command": "migrate", "csrf_token": held}).status_code == 403


def test_a_hook_that_raises_is_a_403_logged_once_with_its_class(make, caplog):
    def broken(req):
        raise LookupError("patient 4711 Jane Doe")

    app = make(console_operator=broken)
    client = browser(app)
    with caplog.at_level(logging.WARNING, logger="cronbox"):
        refused = client.get("/ops/")
    assert refused.status_code == 403 and "Not allowed" in refused.get_data(as_text=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "cronbox"]
    assert lines == ["cronbox: console_operator hook raised LookupError; request refused"]
    assert "Jane" not in caplog.text and "4711" not in caplog.text
    # Not a string either is the host's mistake, refused the same way.
    app = make(console_operator=lambda req: USERS["alice"])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cronbox"):
        assert browser(app).get("/ops/").status_code == 403
    assert [r.getMessage() for r in caplog.records if r.name == "cronbox"] == [
        "cronbox: console_operator hook raised TypeError; request refused"]


def test_uploads_through_the_hook_for_staff_only_with_the_token(make, runtime):
    app = make(console_operator=staff_only, upload_operator=staff_only)

    @app.get("/scans/new")
    def upload_form():  # the host's own page with its upload form
        if not staff_only(request):
            abort(403)
        return ('<form method="post" action="/files" enctype="multipart/form-data">'
                f'<input type="hidden" name="csrf_token" value="{cronbox.upload_csrf_token()}">'
                '<input name="owner"><input type="file" name="file"></form>')

    def upload(client, token: str | None = None, query: str = "", **headers):
        return client.post(f"/files{query}", headers=headers, content_type="multipart/form-data",
                           data={**({"csrf_token": token} if token is not None else {}), "owner": "patient:5",
                                 "file": (io.BytesIO(b"%PDF scan"), "scan.pdf")})

    staff = browser(app, "alice")
    page = staff.get("/scans/new").get_data(as_text=True)
    assert re.search(r'action="([^"]+)"', page).group(1) == "/files"
    sent_token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    done = upload(staff, sent_token)
    assert done.status_code == 201, done.get_data(as_text=True)
    with runtime.sessions() as s:
        assert s.get(SealedFile, done.json["id"]) is not None
        detail = s.scalar(select(AuditEntry.detail).where(AuditEntry.file_id == done.json["id"],
                                                          AuditEntry.action == "put"))
    assert detail.endswith("by staff:alice")
    assert upload(staff, **{"X-CSRF-Token": sent_token}).status_code == 201  # a script's header

    # Without the token, with a forged one, or with alice's token in another user's browser: refused.
    for token in [None, "", "forged", f"{sent_token[:-2]}xx", "1.abc"]:
        refused = upload(staff, token)
        assert refused.status_code == 403 and "CSRF" in refused.json["error"], token
    # The old place, the URL's query string (kept by access logs): refused, even with a good token.
    in_url = upload(staff, sent_token, query=f"?csrf_token={sent_token}")
    assert in_url.status_code == 403 and "never in the URL" in in_url.json["error"]
    query = sent_token
    USERS["carol"] = User("carol", staff=True)
    try:
        assert upload(browser(app, "carol"), query).status_code == 403
    finally:
        del USERS["carol"]
    assert upload(browser(app, "bob"), query).status_code == 403  # signed in, refused (False)
    assert upload(browser(app), query).status_code == 401  # nobody signed in (None)
    with runtime.sessions() as s:
        assert len(list(s.scalars(select(SealedFile.id)))) == 2

    # No hook and no upload token: POST /files stays switched off, as before.
    assert upload(browser(make(console_operator=staff_only), "alice"), query).status_code == 404
    # A hook that raises: 403, not a 500.
    broken = make(upload_operator=lambda req: 1 / 0)
    assert upload(browser(broken), query).status_code == 403


def test_hooks_are_checked_at_init_app_and_may_be_given_to_the_constructor(runtime, env, tmp_path):
    (tmp_path / "clinic").mkdir()
    for bad in [{"console_operator": "staff"}, {"upload_operator": 42}, {"console_login_url": "/login"}]:
        with pytest.raises(TypeError):
            Cronbox().init_app(clinic(tmp_path / "clinic"), settings=load_settings(environ=env), **bad)
    with pytest.raises(TypeError):
        Cronbox(console_operater=staff_only)  # a typo is not silently a console without the host's login
    app = clinic(tmp_path / "clinic")
    Cronbox(console_operator=staff_only).init_app(app, settings=load_settings(environ=env)).use_runtime(runtime)
    assert browser(app, "alice").get("/ops/").status_code == 200
    assert browser(app, "bob").get("/ops/").status_code == 403


def test_the_consoles_own_upload_form_works_behind_the_hosts_login(make, runtime):
    app = make(console_operator=staff_only)
    staff = browser(app, "alice")
    page = staff.get("/ops/files").get_data(as_text=True)
    action, token = upload_form(page)
    form = {"csrf_token": "forged", "owner": "patient:3", "file": (io.BytesIO(b"%PDF"), "scan.pdf")}
    assert staff.post(action, data=form, content_type="multipart/form-data").status_code == 400
    form = {"csrf_token": token, "owner": "patient:3", "file": (io.BytesIO(b"%PDF"), "scan.pdf")}
    done = staff.post(action, data=form, content_type="multipart/form-data")
    assert done.status_code == 303 and done.headers["Location"].startswith("/ops/files?file=")
    assert ("staff:alice", "files.upload") in [(who, what) for who, what, _, _ in logged_actions(runtime)]
    with runtime.sessions() as s:
        assert s.scalar(select(AuditEntry.detail).where(AuditEntry.action == "put")).endswith("by staff:alice")
    # Logged out of the host: the same form, the same token, refused before a byte is sealed.
    staff.get("/sign-out")
    form = {"csrf_token": token, "owner": "patient:3", "file": (io.BytesIO(b"%PDF"), "scan.pdf")}
    assert staff.post(action, data=form, content_type="multipart/form-data").status_code == 403
    with runtime.sessions() as s:
        assert len(list(s.scalars(select(SealedFile.id)))) == 1


def test_an_identity_is_one_line_of_at_most_64_characters(make, runtime):
    app = make(console_operator=lambda req: "  staff:eve\nforged: log line" + "x" * 100)
    client = browser(app)
    assert client.post("/ops/once", data={"command": "migrate", "csrf_token": token(client)}).status_code == 303
    (who, action, _, _), = logged_actions(runtime)
    assert action == "once.add" and who.startswith("staff:eve?forged: log line") and len(who) == 64


def test_a_raising_login_url_function_is_a_refusal_too(make, caplog):
    def login_url(next_path):
        raise KeyError(next_path)

    app = make(console_operator=staff_only, console_login_url=login_url)
    with caplog.at_level(logging.WARNING, logger="cronbox"):
        assert browser(app).get("/ops/").status_code == 403
    assert [r.getMessage() for r in caplog.records if r.name == "cronbox"] == [
        "cronbox: console_login_url raised KeyError; request refused"]


class DocsUser(UserMixin):
    """A user as docs/howto/console.md's hook reads one: `email`, `is_staff`."""

    def __init__(self, email: str, is_staff: bool):
        self.id, self.email, self.is_staff = email, email, is_staff


def test_the_console_guides_hook_runs_as_written(runtime, env, tmp_path):
    """docs/howto/console.md's `staff_only` and its `init_app` call, in a Flask-Login app: staff reach the
    console under their e-mail, other users get the 403 page, nobody signed in is sent to /login."""
    from tests.docs_snippets import snippet

    users = {u.email: u for u in (DocsUser("ada@clinic.example", True), DocsUser("bob@clinic.example", False))}
    app = Flask("clinic", root_path=str(tmp_path))
    app.config.update(SECRET_KEY="the clinic's own secret key", TESTING=True)
    LoginManager(app).user_loader(users.get)

    @app.get("/sign-in/<email>")
    def sign_in(email: str):
        login_user(users[email])
        return "signed in"

    code = snippet("docs/howto/console.md", "console_operator=staff_only")
    exec(compile(code, "docs/howto/console.md", "exec"),
         {"app": app, "db": None, "cronbox": Cronbox(settings=load_settings(environ=env))})
    app.extensions["cronbox"].use_runtime(runtime)

    ada = browser(app, "ada@clinic.example")
    assert ada.get("/ops/").status_code == 200
    assert ada.post("/ops/once", data={"command": "migrate", "csrf_token": token(ada)}).status_code == 303
    assert logged_actions(runtime)[-1][:2] == ("ada@clinic.example", "once.add")
    assert browser(app, "bob@clinic.example").get("/ops/").status_code == 403
    anonymous = browser(app).get("/ops/queues")
    assert anonymous.status_code == 302 and urlsplit(anonymous.location).path == "/login"
    assert parse_qs(urlsplit(anonymous.location).query)["next"] == ["/ops/queues"]
