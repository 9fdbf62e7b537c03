"""Login, logout and the first-run setup page."""
from __future__ import annotations

import logging

from flask import Response, redirect, render_template, request, url_for

from cronbox.cron.operator import credentials, sessions, throttle
from cronbox.outbox.core import clock
from cronbox.outbox.core.transactions import in_transaction
from cronbox.web.state import runtime

from .. import bp, cookie
from ..guard import act, client, safe_next, settings

log = logging.getLogger("cronbox")


def _take_try():
    """A throttle slot for this client; the refusal is recorded once per window, not once per try (a
    flood of refused tries must not grow the action log)."""
    ip = client()
    ticket = in_transaction(runtime().sessions, lambda s: throttle.take(s, ip, clock.utcnow()))
    if ticket.wait is not None and ticket.first_refusal:
        act("login", None, outcome="throttled", detail=f"further tries refused for {ticket.wait} s")
    return ticket


def _throttled(wait: int, template: str, **context):
    minutes = max(1, round(wait / 60))
    response = Response(render_template(template, error=f"Too many tries. Wait {minutes} minute"
                                                        f"{'s' if minutes > 1 else ''} and try again.", **context),
                        status=429)
    response.headers["Retry-After"] = str(wait)
    return response


def _start_session(action: str, ticket: throttle.Ticket) -> None:
    """A fresh session id (never reuse one from before the login) and a fresh CSRF token."""
    console = cookie.current()
    agent, old = request.headers.get("User-Agent"), console.get("ops")
    fingerprint = credentials.fingerprint(settings())
    ip = client()

    def work(s):
        sessions.end(s, old)
        throttle.give_back(s, ticket)
        return sessions.start(s, clock.utcnow(), fingerprint=fingerprint, client_ip=ip, user_agent=agent)

    raw = act(action, None, work)
    console.clear()
    console.set("ops", raw)


@bp.route("/login", methods=["GET", "POST"])
def login():
    st = settings()
    if not credentials.is_configured(st):
        return redirect(url_for("ops.setup"))
    target = safe_next(request.values.get("next"))
    if request.method == "GET":
        return render_template("cronbox_ops/login.html", next=target)
    ticket = _take_try()
    if ticket.wait is not None:
        return _throttled(ticket.wait, "cronbox_ops/login.html", next=target)
    if not credentials.check_password(st, request.form.get("password", "")):
        act("login", None, outcome="wrong-password")
        return render_template("cronbox_ops/login.html", next=target, error="Wrong password."), 401
    _start_session("login", ticket)
    return redirect(target, code=303)


@bp.post("/logout")
def logout():
    console = cookie.current()
    raw = console.get("ops")
    act("logout", None, lambda s: sessions.end(s, raw))
    console.clear()
    console.flash("Logged out.")
    return redirect(url_for("ops.login"), code=303)


@bp.post("/logout-everywhere")
def logout_everywhere():
    act("logout-everywhere", None, sessions.end_all, outcome=lambda count: "ok")
    console = cookie.current()
    console.clear()
    console.flash("Every console session has been ended.")
    return redirect(url_for("ops.login"), code=303)


@bp.route("/setup", methods=["GET", "POST"])
def setup():
    """First run only: the token from <instance>/ops-setup-token proves access to the hosting account."""
    st = settings()
    if credentials.is_configured(st):
        return redirect(url_for("ops.login"))
    credentials.ensure_setup_token(st)
    where = credentials.TOKEN_FILE
    if request.method == "GET":
        return render_template("cronbox_ops/setup.html", token_file=where)
    ticket = _take_try()
    if ticket.wait is not None:
        return _throttled(ticket.wait, "cronbox_ops/setup.html", token_file=where)
    if not credentials.check_setup_token(st, request.form.get("token", "")):
        act("setup", None, outcome="wrong-token")
        return render_template("cronbox_ops/setup.html", token_file=where, error="That is not the setup token."), 401
    try:
        credentials.validate_new_password(request.form.get("password", ""), request.form.get("confirm_password", ""))
        credentials.store_password(st, request.form["password"], replace=False)
    except credentials.CredentialError as exc:
        in_transaction(runtime().sessions, lambda s: throttle.give_back(s, ticket))
        return render_template("cronbox_ops/setup.html", token_file=where, error=f"Not set: {exc}."), 400
    _start_session("setup", ticket)
    cookie.flash("Password set. Keep it in a password manager: the setup token is gone.")
    return redirect(url_for("ops.overview"), code=303)
