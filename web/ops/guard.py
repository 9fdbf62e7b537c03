"""Request plumbing of the console: CSRF and login checks, security headers, errors, action helpers."""
from __future__ import annotations

import logging
from typing import Callable, TypeVar
from urllib.parse import urlsplit

from flask import Response, abort, current_app, flash, g, redirect, render_template, request, session, url_for
from flask_wtf.csrf import CSRFError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from outbox import clock
from outbox.db import in_transaction
from outbox.errors import SchemaError
from web import runtime
from web.client import client_ip

from . import actions, bp, csrf, sessions
from .paging import BadCursor

log = logging.getLogger("cronbox")
T = TypeVar("T")
PUBLIC = {"ops.login", "ops.setup", "ops.static"}
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
}


def settings():
    return current_app.extensions["cronbox"].settings


def client() -> str | None:
    return client_ip(request, settings().trusted_proxies)


@bp.before_request
def check_request():
    g.ops_session = None
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        csrf.protect()  # raises CSRFError (400) without a valid token for this session
    if request.endpoint in PUBLIC:
        return None
    current = in_transaction(runtime().sessions,
                             lambda s: sessions.check(s, session.get("ops"), clock.utcnow()))
    if current is None:
        if request.method in ("GET", "HEAD"):
            return redirect(url_for("ops.login", next=request.full_path.rstrip("?")))
        return Response("Log in first.\n", status=401, mimetype="text/plain")
    g.ops_session = current
    return None


@bp.after_request
def security_headers(response: Response) -> Response:
    response.headers.update(HEADERS)
    return response


def _error_page(status: int, title: str, text: str):
    return render_template("ops/error.html", title=title, text=text), status


@bp.errorhandler(CSRFError)
def csrf_refused(error: CSRFError):
    log.warning("ops: form refused (%s) from %s", error.description, client() or "-")
    return _error_page(400, "Form refused", "The form was too old or did not come from this console. "
                                            "Go back, reload the page and try again.")


@bp.errorhandler(BadCursor)
def bad_cursor(error: BadCursor):
    return _error_page(400, "Bad request", str(error))


@bp.errorhandler(SchemaError)
def schema_missing(error: SchemaError):
    return _error_page(503, "Database not ready", str(error))


@bp.errorhandler(DBAPIError)
def database_down(error: DBAPIError):
    log.error("ops: database error: %s", type(error.orig).__name__)
    return _error_page(503, "Database unavailable", "The database did not answer. Try again in a minute; "
                                                    "if it lasts, check the database in cPanel.")


def safe_next(target: str | None) -> str:
    """Only a path inside the console: never another host (an open redirect after login)."""
    default = url_for("ops.overview")
    if not target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/ops/") or "\\" in target:
        return default
    return target


def act(action: str, target: str | None, work: Callable[[Session], T], *, detail: str | None = None,
        outcome: Callable[[T], str] | None = None) -> T:
    """Do an operator action and record it in the same transaction (both or neither)."""
    ip = client()

    def run(s: Session) -> T:
        result = work(s)
        actions.record(s, action, target=target, outcome=outcome(result) if outcome else "ok", detail=detail,
                       client_ip=ip)
        return result

    return in_transaction(runtime().sessions, run)


def form_ids(name: str = "id") -> list[int]:
    """Positive integer ids from the form; 400 on anything else."""
    values = request.form.getlist(name)
    try:
        ids = [int(v) for v in values]
    except ValueError:
        abort(400, description="ids must be numbers")
    if any(i < 1 for i in ids) or len(ids) > 1000:
        abort(400, description="ids must be positive numbers (at most 1000)")
    return list(dict.fromkeys(ids))


def confirmed() -> bool:
    return request.form.get("confirm") == "yes"


def confirm_page(title: str, message: str, button: str):
    """The confirmation step of a destructive action: the same form again, with confirm=yes."""
    fields = [(k, v) for k, values in request.form.lists() if k not in ("csrf_token", "confirm") for v in values]
    back = safe_next(request.form.get("back") or request.referrer and urlsplit(request.referrer).path)
    return render_template("ops/confirm.html", title=title, message=message, button=button, fields=fields,
                           action=request.path, back=back)


def done(message: str, endpoint: str, **values) -> Response:
    flash(message)
    return redirect(url_for(endpoint, **values), code=303)


@bp.errorhandler(400)
def bad_request(error):
    return _error_page(400, "Bad request", getattr(error, "description", None) or "The request was not understood.")


@bp.errorhandler(404)
def not_found(error):
    return _error_page(404, "Not found", "There is nothing here.")
