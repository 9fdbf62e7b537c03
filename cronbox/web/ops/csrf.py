"""The console's CSRF token, checked by the blueprint's before_request on every unsafe request.

Not Flask-WTF: its CSRFProtect is app-wide (init_app on the host's app changes
how the host's own forms are protected) and keeps its secret in flask.session,
which is the host's. Here the token is an HMAC of the visit's id (the `sid` in
the console's own cookie, cronbox.web.ops.cookie) with a key derived from the
URL-signing keys: useless without that cookie, different in every browser,
new after each login and logout (the visit id is replaced), and still valid
across `storage new-key` (older keys verify). Over HTTPS the Referer must name
this host too, as Flask-WTF's strict mode asks: a page of another origin on the
same site cannot post with a token it has read.

Behind the host's login (the `console_operator` hook, cronbox.web.hostauth) there
is no cronbox login to renew the visit id, so the token is bound to the host's
identity as well: a token made for one staff user is refused for another in the
same browser, and every visit still has its own (the console's cookie, which
the host's session never holds).
"""
from __future__ import annotations

import base64
import hashlib
import hmac

from flask import current_app, g, request
from werkzeug.exceptions import BadRequest

from cronbox.web import hostauth
from cronbox.web.client import referrer_refusal

from . import cookie

FIELD = "csrf_token"
_KEYS = b"cronbox ops csrf v1"


class CsrfRefused(BadRequest):
    """A form without a token matching this browser's visit (guard.py shows the "Form refused" page)."""


def _mac(key: bytes, sid: str) -> str:
    return base64.urlsafe_b64encode(hmac.new(key, _bound(sid).encode(), hashlib.sha256).digest()).rstrip(b"=").decode()


def _bound(sid: str) -> str:
    """What the token signs: the visit, and the host's identity when the host's login guards the console."""
    who = g.get(hostauth.CONSOLE_OPERATOR)
    return sid if who is None else f"{sid}\n{who}"


def token() -> str:
    """The token for this browser's forms (starting a visit if there is none yet)."""
    return _mac(cookie.derived_keys(_KEYS)[-1], cookie.current().sid())


def check(sent: str | None) -> None:
    """Raise CsrfRefused unless `sent` is this visit's token (and, over HTTPS, the Referer is this host)."""
    if not sent:
        raise CsrfRefused("The CSRF token is missing.")
    sid = cookie.current().get("sid")
    if not sid:
        raise CsrfRefused("The CSRF session token is missing.")
    given = sent.encode("utf-8", "replace")
    if not any(hmac.compare_digest(given, _mac(key, sid).encode()) for key in cookie.derived_keys(_KEYS)):
        raise CsrfRefused("The CSRF token is invalid.")
    refusal = referrer_refusal(request, current_app.extensions["cronbox"].settings.trusted_proxies)
    if refusal:
        raise CsrfRefused(refusal)
