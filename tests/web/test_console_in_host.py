"""The console inside a user's own Flask app changes nothing of that app (issue 10).

The host here has what real ones have: its own SECRET_KEY and flask.session login, its own blueprint
at the top level, its forms guarded by Flask-WTF's CSRFProtect, a JSON 404 handler and its own
templates/ops/ folder. Its users signed in before cronbox was added must stay signed in, its forms
stay protected, its tokens keep verifying, its routes see the raw client address and scheme, and
its app object (config, secret key, session interface, wsgi_app, handlers, template globals) is
the same after `Cronbox().init_app(app)` as before. The console meanwhile works with its own cookie
and CSRF token, wherever it is mounted. On SQLite and MariaDB.
"""
from __future__ import annotations

import copy
import io
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from flask import Blueprint, Flask, abort, jsonify, render_template_string, request, session
from flask_wtf.csrf import CSRFProtect, generate_csrf
from itsdangerous import URLSafeTimedSerializer
from sqlalchemy import func, select

from cronbox.cron.operator.models import OperatorSession
from cronbox.cron.scheduling.models import OnceRequest
from cronbox.storage import keys
from cronbox.outbox.core.settings import load_settings
from tests.console_helpers import PASSWORD, Operator, csrf_token, upload_form
from cronbox import Cronbox

# The host app's login and form handling: the server behind the rows changes nothing, so not PostgreSQL
# too (.ci/run's 30 minutes; storage rows are tested on it by test_storage_http and test_storage_hardening).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

HOST_SECRET = "the clinic's own secret key"
HOST_FORM = '<form method="post"><input type="hidden" name="csrf_token" value="{{ csrf_token() }}"></form>'


def clinic(root: Path) -> Flask:
    """The user's app, from its factory, before cronbox is added."""
    app = Flask("clinic", root_path=str(root))
    app.config.update(SECRET_KEY=HOST_SECRET, TESTING=True)
    CSRFProtect(app)
    site = Blueprint("site", "clinic")

    @site.get("/sign-in/<name>")
    def sign_in(name: str):
        session["user"] = name
        return "signed in"

    @site.get("/me")
    def me():
        return jsonify(user=session.get("user"), remote_addr=request.remote_addr, scheme=request.scheme,
                       secure=request.is_secure)

    @site.route("/profile", methods=["GET", "POST"])
    def profile():
        if request.method == "POST":
            return "saved"
        return render_template_string(HOST_FORM)

    @site.get("/patients/<int:patient>")
    def patient(patient: int):
        abort(404)

    app.register_blueprint(site)

    @app.errorhandler(404)
    def not_found(error):
        return jsonify(error="not found"), 404

    return app


def host_templates(root: Path) -> None:
    """The host's own templates/ops/, the folder name the console's templates once had."""
    folder = root / "templates" / "ops"
    folder.mkdir(parents=True)
    for name in ("base.html", "login.html", "error.html", "setup.html"):
        (folder / name).write_text("<p>the clinic's own ops page</p>")


def what_the_host_owns(app: Flask) -> dict:
    """Everything of the host's app that a library must leave alone."""
    return {
        "config": {k: copy.copy(v) for k, v in app.config.items() if not k.startswith("CRONBOX_")},
        "secret_key": app.secret_key,
        "session_interface": app.session_interface,
        "wsgi_app": app.wsgi_app,
        "app error handlers": {code: dict(handlers) for code, handlers in app.error_handler_spec[None].items()},
        "app before_request": list(app.before_request_funcs.get(None, [])),
        "app after_request": list(app.after_request_funcs.get(None, [])),
        "app context processors": list(app.template_context_processors.get(None, [])),
        "template globals": dict(app.jinja_env.globals),
        "url_value_preprocessors": list(app.url_value_preprocessors.get(None, [])),
        "teardown": list(app.teardown_request_funcs.get(None, [])),
    }


@pytest.fixture
def make(runtime, env, tmp_path):
    """The user's app with cronbox added (`extra`: CRONBOX_* settings); `make.before` is what the app
    owned before `init_app`."""
    def make(**extra) -> Flask:
        app = clinic(tmp_path / "clinic")
        make.before = what_the_host_owns(app)
        Cronbox().init_app(app, settings=load_settings(environ={**env, **extra})).use_runtime(runtime)
        return app

    (tmp_path / "clinic").mkdir()
    host_templates(tmp_path / "clinic")
    return make


def set_cookies(response) -> dict[str, str]:
    return {header.split("=", 1)[0]: header for header in response.headers.getlist("Set-Cookie")}


@pytest.mark.parametrize("prefix", ["", "/admin"])
def test_the_host_app_is_unchanged_and_its_users_stay_signed_in(make, runtime, env, tmp_path, prefix):
    # Before cronbox: a user signs in (flask.session, the host's key) and the host signs a token.
    before = clinic(tmp_path / "clinic")
    browser = before.test_client()
    assert browser.get("/sign-in/alice").status_code == 200
    host_cookie = browser.get_cookie("session")
    with before.app_context():
        reset_link = URLSafeTimedSerializer(before.secret_key).dumps({"user": "alice"}, salt="reset")

    app = make(CRONBOX_OPS_PREFIX=prefix)
    owned, after = make.before, what_the_host_owns(app)
    assert after == owned, [k for k in owned if owned[k] != after[k]]
    assert URLSafeTimedSerializer(app.secret_key).loads(reset_link, salt="reset") == {"user": "alice"}

    client = app.test_client()
    client.set_cookie("session", host_cookie.value)
    assert client.get("/me").json["user"] == "alice"  # signed in before cronbox, still signed in
    # The host's own CSRF protection still refuses a forged form and accepts its own.
    assert client.post("/profile").status_code == 400
    assert client.post("/profile", data={"csrf_token": "forged"}).status_code == 400
    token = csrf_token(client.get("/profile").get_data(as_text=True))
    assert client.post("/profile", data={"csrf_token": token}).get_data(as_text=True) == "saved"
    # The host's 404s stay JSON, its pages carry none of the console's headers.
    for missing in ["/nothing-here", "/patients/7", "/ops-elsewhere", f"{prefix}/opsx"]:
        response = client.get(missing)
        assert response.status_code == 404 and response.json == {"error": "not found"}, missing
    assert "Content-Security-Policy" not in client.get("/me").headers

    # The console, in the same browser: its own cookie on its own path, the host's session untouched.
    base = f"{prefix}/ops"
    operator = Operator(app, base=base, client=client)
    setup_page = client.get(f"{base}/setup")
    assert "cronbox console" in setup_page.get_data(as_text=True)  # the console's template, not the host's
    assert "the clinic's own ops page" not in setup_page.get_data(as_text=True)
    cookies = set_cookies(setup_page)
    assert list(cookies) == ["cronbox_ops"]
    assert f"Path={base};" in cookies["cronbox_ops"] or cookies["cronbox_ops"].endswith(f"Path={base}")
    response = operator.set_up()
    assert response.status_code == 303 and response.headers["Location"] == f"{base}/"
    assert list(set_cookies(response)) == ["cronbox_ops"]
    assert client.get_cookie("cronbox_ops", path=base) is not None
    assert client.get(f"{base}/").status_code == 200
    assert client.get("/me").json["user"] == "alice"
    assert client.get(f"{base}/no-such-page").status_code == 404
    assert "There is nothing here" in client.get(f"{base}/no-such-page").get_data(as_text=True)

    # Its forms refuse a missing, forged or host-made token (and the host's refuse the console's).
    for form in [{}, {"csrf_token": "forged"}, {"csrf_token": token}]:
        refused = client.post(f"{base}/queues/flush", data={**form, "confirm": "yes"})
        assert refused.status_code == 400 and "Form refused" in refused.get_data(as_text=True), form
    console_token = operator.token(f"{base}/")
    assert client.post("/profile", data={"csrf_token": console_token}).status_code == 400
    flushed = client.post(f"{base}/queues/flush", data={"csrf_token": console_token, "confirm": "yes"})
    assert flushed.status_code == 303 and flushed.headers["Location"] == f"{base}/once"
    assert "deleted at the next tick" in client.get(f"{base}/once").get_data(as_text=True)  # the flash message
    with runtime.sessions() as s:
        assert s.scalar(select(func.count()).select_from(OnceRequest)) == 1

    # next= leads only inside the console where it is mounted.
    stranger = Operator(app, base=base)
    for target, expected in [(f"{base}/queues?queue=sms", f"{base}/queues?queue=sms"), ("/me", f"{base}/"),
                             ("/ops/queues" if prefix else "/admin/ops/queues", f"{base}/"),
                             (f"//evil.example{base}/", f"{base}/")]:
        response = stranger.post(f"{base}/login", {"password": PASSWORD, "next": target}, page=f"{base}/login")
        assert response.status_code == 303 and response.headers["Location"] == expected, target
    assert stranger.get(f"{base}/queues").status_code == 200  # logged in by now
    anonymous = Operator(app, base=base)
    to_login = urlsplit(anonymous.get(f"{base}/queues?queue=sms").headers["Location"])
    assert to_login.path == f"{base}/login" and parse_qs(to_login.query)["next"] == [f"{base}/queues?queue=sms"]

    # Logging the console out leaves the host's session alone, and the other way round.
    assert operator.post(f"{base}/logout").status_code == 303
    assert client.get("/me").json["user"] == "alice"
    assert client.get(f"{base}/").status_code == 302
    with runtime.sessions() as s:
        assert s.scalar(select(func.count()).select_from(OperatorSession)) == 1  # the stranger's


def test_the_console_upload_stays_under_the_console(make, runtime):
    """Its cookie never reaches /files, so the Files page posts to the console's own upload route."""
    app = make(CRONBOX_OPS_PREFIX="/admin")
    operator = Operator(app, base="/admin/ops")
    assert operator.set_up().status_code == 303
    page = operator.get("/admin/ops/files").get_data(as_text=True)
    action, token = upload_form(page)
    assert action == "/admin/ops/upload"
    response = operator.client.post(action, data={"csrf_token": token, "owner": "patient:3",
                                                  "file": (io.BytesIO(b"%PDF"), "scan.pdf")},
                                    content_type="multipart/form-data")
    assert response.status_code == 303 and response.headers["Location"].startswith("/admin/ops/files?file=")
    assert "Sealed as file" in operator.get(response.headers["Location"]).get_data(as_text=True)


def test_behind_a_trusted_proxy_the_console_cookie_is_secure_and_the_host_sees_raw_addresses(make):
    app = make(CRONBOX_TRUSTED_PROXIES="1")
    proxied = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "203.0.113.9",
               "HTTP_X_FORWARDED_PROTO": "https", "HTTP_REFERER": "http://localhost/ops/setup"}
    operator = Operator(app, **proxied)
    page = operator.get("/ops/setup")
    assert "Secure" in set_cookies(page)["cronbox_ops"]
    # Over HTTPS a form must come from this host: the Referer says so, as Flask-WTF's strict mode asked.
    assert operator.set_up().status_code == 400  # the Referer above is http://, not this https:// host
    operator.environ["HTTP_REFERER"] = "https://localhost/ops/setup"
    response = operator.set_up()
    assert response.status_code == 303 and "Secure" in set_cookies(response)["cronbox_ops"]
    del operator.environ["HTTP_REFERER"]
    assert operator.post("/ops/logout").status_code == 400  # no Referer at all
    # The host's own routes see the connection as it is: cronbox wraps nothing of the app.
    seen = app.test_client().get("/me", environ_base=proxied).json
    assert seen["remote_addr"] == "10.0.0.2" and seen["scheme"] == "http" and seen["secure"] is False
    # Without the proxy's word (or with more hops claimed than trusted) the cookie is not Secure.
    plain = Operator(app, REMOTE_ADDR="10.0.0.2")
    assert "Secure" not in set_cookies(plain.get("/ops/login"))["cronbox_ops"]
    # The client's own "https" followed by the one trusted proxy's "http": the proxy's word counts.
    spoofed = Operator(app, HTTP_X_FORWARDED_PROTO="https, http")
    assert "Secure" not in set_cookies(spoofed.get("/ops/login"))["cronbox_ops"]


def test_an_untrusted_forwarded_proto_is_ignored(make):
    app = make()  # CRONBOX_TRUSTED_PROXIES=0
    page = Operator(app, HTTP_X_FORWARDED_PROTO="https").get("/ops/setup")
    assert "Secure" not in set_cookies(page)["cronbox_ops"]
    assert "Secure" in set_cookies(app.test_client().get("/ops/setup", base_url="https://localhost"))["cronbox_ops"]


def test_a_tampered_console_cookie_is_a_fresh_visit_and_a_new_signing_key_logs_nobody_out(make, runtime):
    app = make()
    operator = Operator(app)
    assert operator.set_up().status_code == 303
    cookie = operator.client.get_cookie("cronbox_ops", path="/ops")
    forged = Operator(app)
    value = cookie.value
    forged.client.set_cookie("cronbox_ops", value[:-2] + ("AA" if value[-2:] != "AA" else "BB"), path="/ops")
    assert forged.get("/ops/").status_code == 302
    signed_with_host_key = URLSafeTimedSerializer(HOST_SECRET, salt="cookie-session").dumps({"ops": "x"})
    forged.client.set_cookie("cronbox_ops", signed_with_host_key, path="/ops")
    assert forged.get("/ops/").status_code == 302
    # `storage new-key --signing`: the newest key signs from now on, cookies and tokens signed before still
    # verify (no restart: the key folder is re-read when it changes).
    old_token = operator.token("/ops/")
    keys.new_key(app.extensions["cronbox"].settings, keys.SIGNING)
    assert operator.get("/ops/").status_code == 200
    response = operator.client.post("/ops/once", data={"csrf_token": old_token, "command": "migrate"})
    assert response.status_code == 303
    assert operator.token("/ops/") != old_token  # the page's token now comes from the new key
    assert operator.post("/ops/once", {"command": "migrate"}).status_code == 303


def test_the_hosts_csrf_protect_leaves_cronbox_bearer_posts_alone(runtime, env, tmp_path):  # runtime: the schema
    """POST /files and POST /cron/tick carry a bearer token a browser never sends on its own: the
    host's CSRFProtect (set up before cronbox here, after it in `late`) must not refuse them, nor read
    the upload's body as a form; the host's own forms stay protected."""
    settings = load_settings(environ={**env, "CRONBOX_UPLOAD_TOKEN": "up-token", "CRONBOX_CRON_TOKEN": "tick-token"})
    (tmp_path / "clinic").mkdir()
    app = clinic(tmp_path / "clinic")
    Cronbox().init_app(app, settings=settings)
    late = Flask("late")
    late.secret_key = HOST_SECRET
    Cronbox().init_app(late, settings=settings)
    CSRFProtect(late)

    @late.post("/late-form")
    def late_form():
        return "saved"

    try:
        posts_pass(app, late)
    finally:
        for application in (app, late):
            application.extensions["cronbox"].runtime.dispose()


def posts_pass(app: Flask, late: Flask) -> None:
    for application in (app, late):
        client = application.test_client()
        upload = client.post("/files", data=b"%PDF scan", headers={
            "Authorization": "Bearer up-token", "X-Cronbox-Filename": "scan.pdf", "X-Cronbox-Owner": "patient:9",
            "Content-Type": "application/pdf"})
        assert upload.status_code == 201, upload.get_data(as_text=True)
        multipart = client.post("/files", headers={"Authorization": "Bearer up-token"},
                                data={"owner": "patient:9", "file": (io.BytesIO(b"%PDF two"), "two.pdf")},
                                content_type="multipart/form-data")
        assert multipart.status_code == 201, multipart.get_data(as_text=True)
        tick = client.post("/cron/tick", headers={"Authorization": "Bearer tick-token"})
        assert tick.status_code in (200, 429), tick.get_data(as_text=True)  # 429: the other app's tick was just now
    assert app.test_client().post("/profile").status_code == 400
    assert late.test_client().post("/late-form").status_code == 400
