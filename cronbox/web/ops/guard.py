"""Request plumbing of the console: CSRF and login checks, its cookie, security headers, errors, action helpers.

Everything here is the blueprint's own (before_request, after_request, errorhandler, context_processor):
a host's pages never meet it.
"""
from __future__ import annotations

import logging
import posixpath
from typing import Callable, TypeVar
from urllib.parse import urlencode, urlsplit

from flask import Response, abort, current_app, g, redirect, render_template, request, url_for
from werkzeug.exceptions import RequestEntityTooLarge, UnsupportedMediaType
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from cronbox.cron.operator import actions, credentials, sessions
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SchemaError
from cronbox.outbox.core.transactions import in_transaction
from cronbox.web.state import runtime
from cronbox.web import formstream, hostauth
from cronbox.web.client import client_ip

from . import bp, cookie, csrf
from cronbox.outbox.core.paging import ID_DIGITS, MAX_ID, BadCursor
from cronbox.outbox.core.text import ascii_number

log = logging.getLogger("cronbox")
T = TypeVar("T")
PUBLIC = {"ops.login", "ops.setup", "ops.static"}
PASSWORD_PAGES = {"ops.login", "ops.setup", "ops.logout", "ops.logout_everywhere"}  # gone with the host's login
# The upload's body is sealed while it streams: its token is a field before the file part, or a header
# (cronbox.web.ops.upload); never the query string, which access logs keep.
TOKEN_BEFORE_FILE = {"ops.files_upload"}
TOKEN_HEADER = "X-CSRF-Token"
OPERATOR = "cronbox_ops_operator"  # flask.g: the live operator session of this request, if any
HOST_OPERATOR = hostauth.CONSOLE_OPERATOR  # flask.g: the host's identity for this request (console_operator)
HEADERS = {
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


def signed_in():
    """The live operator session of this request (set by check_request), or None."""
    return g.get(OPERATOR)


def host_login() -> bool:
    """Whether the host's own login guards the console (the `console_operator` hook)."""
    return current_app.extensions["cronbox"].console_operator is not None


def operator_name() -> str:
    """Who acts, for the activity log and the file audit: the host's identity, else cronbox's one operator."""
    return g.get(HOST_OPERATOR) or actions.OPERATOR


FORM_MAX = 64 * 1024  # a console form is a token and a few ids or words: anything bigger is not one of ours


@bp.url_value_preprocessor
def limit_form_bodies(endpoint, values) -> None:
    """Every console POST but the upload is a small url-encoded form: less than FORM_MAX bytes, declared
    (Content-Length) or streamed (chunked), refused with 413 before anything parses it. Werkzeug
    would write a multipart body's file parts to temporary files while parsing it (an anonymous 20 MiB
    "login"), so a multipart body is never parsed here at all: 413 when too large, else 415.
    A url_value_preprocessor runs before every before_request (the host's too); the limit is this
    request's own (Flask's per-request max_content_length), the host's MAX_CONTENT_LENGTH is untouched."""
    if request.method in ("GET", "HEAD", "OPTIONS") or endpoint in TOKEN_BEFORE_FILE:
        return
    request.max_content_length = FORM_MAX
    request.max_form_memory_size = FORM_MAX
    declared = request.content_length
    if declared is not None and declared > FORM_MAX:
        raise RequestEntityTooLarge(f"A console form is at most {FORM_MAX // 1024} KiB.")
    # Read now, at most FORM_MAX bytes (the stream's per-request maximum), kept for request.form: one byte
    # more is RequestEntityTooLarge. Werkzeug's own url-encoded parsing would stop at the maximum silently.
    request.get_data(cache=True, parse_form_data=False)
    request.stream.read(1)
    if request.mimetype.startswith("multipart/"):
        raise UnsupportedMediaType("A console form is url-encoded.")


@bp.before_request
def check_request():
    setattr(g, OPERATOR, None)
    setattr(g, HOST_OPERATOR, None)
    if host_login():
        return check_host_request()
    if request.method not in ("GET", "HEAD", "OPTIONS"):  # raises CsrfRefused (400) without this visit's token
        csrf.check(sent_token())
    if request.endpoint in PUBLIC:
        return None
    fingerprint = credentials.fingerprint(settings())
    raw = cookie.current().get("ops")
    current = in_transaction(runtime().sessions, lambda s: sessions.check(s, raw, clock.utcnow(), fingerprint))
    if current is None:
        if request.method in ("GET", "HEAD"):
            return redirect(url_for("ops.login", next=request.script_root + request.full_path.rstrip("?")))
        return Response("Log in first.\n", status=401, mimetype="text/plain")
    setattr(g, OPERATOR, current)
    return None


def sent_token() -> str | None:
    """The console's CSRF token as this request sent it: the form's field; for the upload, its
    X-CSRF-Token header or its field before the file part, read without reading the file
    (cronbox.web.formstream; seal_upload resumes there)."""
    if request.endpoint not in TOKEN_BEFORE_FILE:
        return request.form.get(csrf.FIELD)
    try:
        return request.headers.get(TOKEN_HEADER) or formstream.field_before_file(request, csrf.FIELD)
    except ValueError:  # a malformed form: no token in it
        return None


def check_host_request():
    """The host's hook decides who may use the console, on every request; then the console's CSRF token
    (bound to the visit and to that identity). cronbox's own password pages are not offered."""
    if request.endpoint == "ops.static":
        return None
    try:
        who = hostauth.identity("console_operator")
    except hostauth.NotAllowed:  # a signed-in user who may not, or a failed hook: never the login page
        return not_allowed()
    if who is None:
        login_url = current_app.extensions["cronbox"].console_login_url
        if login_url and request.method in ("GET", "HEAD") and not _back_from_login():
            try:
                target = hostauth.login_redirect_target(login_url, hostauth.requested_path())
            except Exception as exc:  # the host's function: a refusal, not a 500
                log.warning("cronbox: console_login_url raised %s; request refused", type(exc).__name__)
            else:
                cookie.current().set("login_sent", int(clock.unix()))
                return redirect(target)
        return not_allowed()
    setattr(g, HOST_OPERATOR, who)
    if cookie.current().get("login_sent") is not None:
        cookie.current().set("login_sent", None)  # in: a later refusal may go to the login again
    if request.endpoint in PASSWORD_PAGES:
        return not_found(None)
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        csrf.check(sent_token())
    return None


LOGIN_ROUND_TRIP = 30  # seconds: refused again this soon after being sent to the login, a browser gets the 403


def _back_from_login() -> bool:
    """Whether this browser was sent to the host's login moments ago and is refused again: a user
    signed in whom the hook answers None for, bounced back by the usual "signed in already: go to
    next" login view. Then the 403 page, not the login again, which would loop for ever (a hook
    that answers False for such a user gets the 403 at once)."""
    sent = cookie.current().get("login_sent")
    return isinstance(sent, int) and 0 <= clock.unix() - sent < LOGIN_ROUND_TRIP


def not_allowed():
    """The host's hook said no (or failed): cronbox's refusal, never its password page."""
    return _error_page(403, "Not allowed", "Your account may not use this console. Sign in to the site "
                                           "with an account that may, or ask who runs it.")


@bp.after_request
def finish(response: Response) -> Response:
    response.headers.update(HEADERS)
    if request.endpoint != "ops.static":  # the stylesheet may be cached; pages never
        response.headers["Cache-Control"] = "no-store"
    return cookie.save(response)


@bp.context_processor
def template_helpers() -> dict:
    """What the console's templates use, for the console's templates only (a host's see none of it).
    Imported macros see them through `import ... with context`."""
    state = current_app.extensions["cronbox"]
    return {"csrf_token": csrf.token, "page_link": page_link, "operator": signed_in() or g.get(HOST_OPERATOR),
            "host_login": state.console_operator is not None, "host_logout_url": state.console_logout_url,
            "flashed_messages": lambda: cookie.current().pop_flashes()}


def _error_page(status: int, title: str, text: str):
    return render_template("cronbox_ops/error.html", title=title, text=text), status


@bp.route("/<path:rest>", methods=["GET", "HEAD", "POST"])
def no_such_page(rest: str):
    """Misses under the console get the console's 404 page from a route of its own: an app-wide 404
    handler would be the host's (which may answer JSON)."""
    return not_found(None)


@bp.errorhandler(csrf.CsrfRefused)
def csrf_refused(error: csrf.CsrfRefused):
    log.warning("ops: form refused (%s) from %s", error.description, client() or "-")
    return _error_page(400, "Form refused", "The form was too old or did not come from this console. "
                                            "Go back, reload the page and try again.")


@bp.errorhandler(BadCursor)
def bad_cursor(error: BadCursor):
    return _error_page(400, "Bad request", str(error))


@bp.errorhandler(SchemaError)
def schema_missing(error: SchemaError):
    return _error_page(503, "Database not ready", str(error))


@bp.errorhandler(OperationalError)
@bp.errorhandler(InterfaceError)
def database_down(error):
    """Connection-level trouble only: a statement refused for its data stays a 500 with its traceback."""
    log.error("ops: database error: %s", type(getattr(error, "orig", error)).__name__)
    return _error_page(503, "Database unavailable", "The database did not answer. Try again in a minute; "
                                                    "if it lasts, check the database in cPanel.")


@bp.errorhandler(400)
def bad_request(error):
    return _error_page(400, "Bad request", getattr(error, "description", None) or "The request was not understood.")


@bp.errorhandler(413)
@bp.errorhandler(415)
def form_refused(error):
    return _error_page(error.code, "Form refused", error.description)


@bp.errorhandler(404)
def not_found(error):
    return _error_page(404, "Not found", "There is nothing here.")


def safe_next(target: str | None) -> str:
    """Only a plain path inside the console (where it is mounted): never another host, never a
    header-breaking character."""
    default = url_for("ops.overview")
    if not target or len(target) > 500 or any(ord(c) < 0x20 or ord(c) == 0x7F for c in target) or "\\" in target:
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or posixpath.normpath(parts.path) + "/" != parts.path.rstrip("/") + "/" \
            or not parts.path.startswith(default):
        return default
    return target


def page_link(name: str, value: str) -> str:
    """This page's URL with its query string, `name` set to `value` (the pager's "Older" link)."""
    query = [(k, v) for k, v in request.args.items(multi=True) if k != name] + [(name, value)]
    return request.script_root + request.path + "?" + urlencode(query)


def act(action: str, target: str | None, work: Callable[[Session], T] | None = None, *, detail: str | None = None,
        outcome: Callable[[T], str] | str = "ok") -> T | None:
    """Do an operator action and record it in the same transaction (both or neither); log it once committed."""
    ip = client()
    recorded = []

    def run(s: Session):
        result = work(s) if work is not None else None
        recorded[:] = [actions.record(s, action, target=target, detail=detail, client_ip=ip, operator=operator_name(),
                                      outcome=outcome(result) if callable(outcome) else outcome)]
        return result

    result = in_transaction(runtime().sessions, run)
    actions.log(recorded[0])
    return result


def form_ids(name: str = "id") -> list[int]:
    """Positive integer ids from the form; 400 on anything else."""
    values = request.form.getlist(name)
    if len(values) > 1000:
        abort(400, description="at most 1000 ids at a time")
    ids = [ascii_number(v, ID_DIGITS) for v in values]
    if None in ids:
        abort(400, description="ids must be numbers")
    if any(not 1 <= i <= MAX_ID for i in ids):
        abort(400, description="ids must be positive numbers")
    return list(dict.fromkeys(ids))


def id_list(ids: list[int]) -> str:
    """Ids as the action log and messages show them: "#3, #7", at most twenty."""
    text = ", ".join(f"#{i}" for i in ids[:20])
    return text + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")


def unchanged_note(unknown: list[int]) -> str:
    return f" Not changed (gone or no longer in that state): {id_list(unknown)}." if unknown else ""


def confirmed() -> bool:
    return request.form.get("confirm") == "yes"


def confirm_page(title: str, message: str, button: str, **extra: str):
    """The confirmation step of a destructive action: the same form again (plus `extra`), with confirm=yes."""
    fields = [(k, v) for k, values in request.form.lists() if k not in ("csrf_token", "confirm", *extra)
              for v in values] + list(extra.items())
    back = safe_next(request.form.get("back") or request.referrer and urlsplit(request.referrer).path)
    return render_template("cronbox_ops/confirm.html", title=title, message=message, button=button, fields=fields,
                           action=request.path, back=back)


def done(message: str, endpoint: str, **values) -> Response:
    cookie.flash(message)
    return redirect(url_for(endpoint, **values), code=303)
