"""The host's own login in front of cronbox: the `console_operator` and `upload_operator` hooks.

    cronbox.init_app(app, db=db,
                     console_operator=lambda request: current_user.email if staff() else None,
                     console_login_url="/login")

A hook is the host's function of the request returning an operator identity
(a string: it names the operator in the activity log and the file audit), None
(nobody is signed in: a console GET is sent to `console_login_url`) or False
(someone is signed in who may not: 403, never the login page, whose usual
"already signed in: go to next" would send the browser straight back, for
ever; a browser refused with None again right after being sent to the login
gets the 403 too: cronbox.web.ops.guard). cronbox calls it on every request to the part it guards,
so logging out of the host closes the console at the next click; cronbox
itself never reads or writes the host's session (the hook may: Flask-Login's
`current_user` reads it). A hook that raises is a refusal, never a 500: one
warning line with the exception's class, nothing of its message (it may hold
a user's name or the host's data).

The answer is cached in flask.g for the request: the console's guard, its
CSRF token and its action log all ask, the hook runs once.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
from urllib.parse import urlencode, urlsplit, urlunsplit

from flask import Request, current_app, g, request

from cronbox.outbox.core.text import ascii_number

from . import formstream
from .client import referrer_refusal

log = logging.getLogger("cronbox")
CONSOLE_OPERATOR = "cronbox_console_operator"  # flask.g: the identity the console let in, for this request
IDENTITY_MAX = 64  # cronbox_ops_actions.operator


class NotAllowed(Exception):
    """The host's hook said a signed-in user may not (False): the request is refused (403)."""


class HookFailed(NotAllowed):
    """The host's hook raised: the request is refused (403), and was logged once."""


def identity(kind: str) -> str | None:
    """The identity the host's `<kind>` hook ("console_operator", "upload_operator") gives this
    request, or None when nobody is signed in; NotAllowed when it refused a signed-in user (False),
    HookFailed when it raised or returned something else than a string, None or False."""
    cache = g.setdefault("cronbox_host_identity", {})
    if kind not in cache:
        cache[kind] = _ask(kind)
    found = cache[kind]
    if isinstance(found, NotAllowed):
        raise found
    return found


def _ask(kind: str) -> str | None | NotAllowed:
    hook = getattr(current_app.extensions["cronbox"], kind)
    try:
        found = hook(request)
        if found is not None and found is not False and not isinstance(found, str):
            raise TypeError(f"the {kind} hook must return a string, None or False")
    except Exception as exc:  # the host's code: any failure is a refusal, not a 500
        log.warning("cronbox: %s hook raised %s; request refused", kind, type(exc).__name__)
        return HookFailed(type(exc).__name__)
    if found is False:
        return NotAllowed(kind)
    # One log line per action: no control characters from the host's data (a name with a newline).
    found = "".join("?" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in (found or "").strip())[:IDENTITY_MAX]
    return found or None


def login_redirect_target(login_url, next_path: str) -> str:
    """Where to send a browser the console refused: the host's login URL with `next` set to the
    console page it asked for (a path of this site, never a full URL), or what the host's callable
    makes of that path."""
    if callable(login_url):
        return login_url(next_path)
    parts = urlsplit(login_url)
    query = "&".join(q for q in (parts.query, urlencode({"next": next_path})) if q)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def requested_path() -> str:
    """This request's path and query as the browser sees them (script root included), for `next`.
    A relative path only: a `next` is never a URL of another host."""
    path = request.script_root + request.full_path.rstrip("?")
    return "/" + path.lstrip("/\\")


# --- uploads from the host's logged-in users (POST /files) ----------------------------------------

UPLOAD_TOKEN_FIELD = "csrf_token"  # a form field sent before the file part (read up to it: cronbox.web.formstream)
UPLOAD_TOKEN_HEADER = "X-CSRF-Token"  # or this header, for a script of the host's pages
UPLOAD_TOKEN_AGE = 8 * 3600  # a working day's page left open
ISSUED_DIGITS = 12  # the token's issue time, Unix seconds: ten digits until the year 2286
_UPLOAD_KEYS = b"cronbox upload csrf v1"


class UploadForbidden(Exception):
    """A browser upload the host's user may not make now (no or a bad CSRF token, a failed hook): 403."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _upload_mac(key: bytes, issued: int, who: str) -> str:
    digest = hmac.new(key, f"{issued}\n{who}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def upload_csrf_token() -> str:
    """The CSRF token for the host's upload form (a `csrf_token` field before the file), for the user the
    `upload_operator` hook names in this request. Bound to that identity, signed with a key derived
    from the URL-signing keys, good for UPLOAD_TOKEN_AGE seconds: cronbox's cookie does not reach
    /files and the host's session is the host's, so the token carries its own proof."""
    who = identity("upload_operator")
    if who is None:
        raise RuntimeError("upload_csrf_token(): the upload_operator hook allows nobody in this request")
    issued = int(time.time())
    return f"{issued}.{_upload_mac(current_app.extensions['cronbox'].derived_keys(_UPLOAD_KEYS)[-1], issued, who)}"


def upload_operator(req: Request, settings) -> str | None:
    """The upload authorizer of the `upload_operator` hook (cronbox.web.files.upload_authorizers): the host's
    user, once its token matches; UploadForbidden for a user without a good token or a failed hook."""
    try:
        who = identity("upload_operator")
    except NotAllowed:
        raise UploadForbidden("not allowed") from None
    if who is None:
        return None
    if UPLOAD_TOKEN_FIELD in req.args:  # access logs keep URLs: a token there is refused, never needed
        raise UploadForbidden(f"send the CSRF token in the {UPLOAD_TOKEN_FIELD} field before the file or in the "
                              f"{UPLOAD_TOKEN_HEADER} header, never in the URL")
    try:
        sent = req.headers.get(UPLOAD_TOKEN_HEADER) or formstream.field_before_file(req, UPLOAD_TOKEN_FIELD) or ""
    except ValueError:  # a malformed form: no token in it
        sent = ""
    text, _, mac = sent.partition(".")
    issued = ascii_number(text, ISSUED_DIGITS)
    if issued is None or not mac:
        raise UploadForbidden("the CSRF token is missing")
    if not 0 <= time.time() - issued <= UPLOAD_TOKEN_AGE:
        raise UploadForbidden("the CSRF token has expired, reload the page")
    keys = current_app.extensions["cronbox"].derived_keys(_UPLOAD_KEYS)
    if not any(hmac.compare_digest(mac.encode("utf-8", "replace"), _upload_mac(key, issued, who).encode())
               for key in keys):
        raise UploadForbidden("the CSRF token is invalid")
    refusal = referrer_refusal(req, settings.trusted_proxies)
    if refusal:
        raise UploadForbidden(refusal.rstrip(".").lower())
    return who
