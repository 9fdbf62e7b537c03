"""Login, logout and the first-run setup page."""
from __future__ import annotations

from flask import Response, flash, redirect, render_template, request, session, url_for

from outbox import clock
from outbox.db import in_transaction
from web import runtime

from .. import actions, bp, credentials, sessions, throttle
from ..guard import client, safe_next, settings


def _throttled(wait: int, template: str, **context):
    minutes = max(1, round(wait / 60))
    response = Response(render_template(template, error=f"Too many tries. Wait {minutes} minute"
                                                        f"{'s' if minutes > 1 else ''} and try again.", **context),
                        status=429)
    response.headers["Retry-After"] = str(wait)
    return response


def _start_session(action: str) -> None:
    """A fresh session id (never reuse one from before the login) and a fresh CSRF token."""
    ip, agent = client(), request.headers.get("User-Agent")
    old = session.get("ops")

    def work(s):
        sessions.end(s, old)
        raw = sessions.start(s, clock.utcnow(), client_ip=ip, user_agent=agent)
        throttle.give_back(s, ip, clock.utcnow())
        actions.record(s, action, client_ip=ip)
        return raw

    raw = in_transaction(runtime().sessions, work)
    session.clear()
    session["ops"] = raw


@bp.route("/login", methods=["GET", "POST"])
def login():
    st = settings()
    if not credentials.is_configured(st):
        return redirect(url_for("ops.setup"))
    target = safe_next(request.values.get("next"))
    if request.method == "GET":
        return render_template("ops/login.html", next=target)
    ip = client()
    wait = in_transaction(runtime().sessions, lambda s: throttle.take(s, ip, clock.utcnow()))
    if wait is not None:
        in_transaction(runtime().sessions, lambda s: actions.record(s, "login", outcome="throttled", client_ip=ip))
        return _throttled(wait, "ops/login.html", next=target)
    if not credentials.check_password(st, request.form.get("password", "")):
        in_transaction(runtime().sessions, lambda s: actions.record(s, "login", outcome="wrong-password",
                                                                    client_ip=ip))
        return render_template("ops/login.html", next=target, error="Wrong password."), 401
    _start_session("login")
    return redirect(target, code=303)


@bp.post("/logout")
def logout():
    raw, ip = session.get("ops"), client()

    def work(s):
        sessions.end(s, raw)
        actions.record(s, "logout", client_ip=ip)

    in_transaction(runtime().sessions, work)
    session.clear()
    flash("Logged out.")
    return redirect(url_for("ops.login"), code=303)


@bp.post("/logout-everywhere")
def logout_everywhere():
    ip = client()

    def work(s):
        count = sessions.end_all(s)
        actions.record(s, "logout-everywhere", detail=f"{count} sessions ended", client_ip=ip)

    in_transaction(runtime().sessions, work)
    session.clear()
    flash("Every console session has been ended.")
    return redirect(url_for("ops.login"), code=303)


@bp.route("/setup", methods=["GET", "POST"])
def setup():
    """First run only: the token from <instance>/ops-setup-token proves access to the hosting account."""
    st = settings()
    if credentials.is_configured(st):
        return redirect(url_for("ops.login"))
    token_path = credentials.ensure_setup_token(st)
    where = token_path.name if token_path else credentials.TOKEN_FILE
    if request.method == "GET":
        return render_template("ops/setup.html", token_file=where)
    ip = client()
    wait = in_transaction(runtime().sessions, lambda s: throttle.take(s, ip, clock.utcnow()))
    if wait is not None:
        return _throttled(wait, "ops/setup.html", token_file=where)
    if not credentials.check_setup_token(st, request.form.get("token", "")):
        in_transaction(runtime().sessions, lambda s: actions.record(s, "setup", outcome="wrong-token", client_ip=ip))
        return render_template("ops/setup.html", token_file=where, error="That is not the setup token."), 401
    try:
        credentials.validate_new_password(request.form.get("password", ""), request.form.get("confirm_password", ""))
        credentials.store_password(st, request.form["password"], replace=False)
    except credentials.CredentialError as exc:
        in_transaction(runtime().sessions, lambda s: throttle.give_back(s, ip, clock.utcnow()))
        return render_template("ops/setup.html", token_file=where, error=f"Not set: {exc}."), 400
    in_transaction(runtime().sessions, sessions.end_all)
    _start_session("setup")
    flash("Password set. Keep it in a password manager: the setup token is gone.")
    return redirect(url_for("ops.overview"), code=303)
