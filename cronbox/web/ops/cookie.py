"""The console's own session cookie, `cronbox_ops`: never flask.session.

flask.session belongs to the host: its SECRET_KEY signs it, its session
interface and cookie name carry it. A library setting any of those logs the
host's users out and breaks what the host signed, so the console keeps its own
cookie, on its own path (the console's URL prefix: the host's pages never
receive it), read and written only by the console's blueprint.

It holds `sid` (a random id of this browser's visit, which the CSRF token is
bound to: cronbox.web.ops.csrf), `ops` (the operator session's raw id, which
cron.operator.sessions checks against its rows) and `flash` (messages for the
next page). It is signed with a key derived from the newest URL-signing key;
older ones still verify, so `storage new-key` logs nobody out. It is not
encrypted, like Flask's: the session id in it is the cookie's whole point.
Attributes: HttpOnly, SameSite=Lax, and Secure exactly when the request came
over HTTPS (through CRONBOX_TRUSTED_PROXIES); no expiry, the server-side
session has its own limits.

One object per request, in flask.g, loaded on first use and written by the
blueprint's after_request when something changed.
"""
from __future__ import annotations

import hashlib
import secrets
from typing import Any

from flask import Response, current_app, g, request, url_for
from itsdangerous import BadSignature, URLSafeSerializer

from cronbox.web.client import is_https

NAME = "cronbox_ops"
SALT = "cronbox.ops.cookie"
_KEYS = b"cronbox ops session v1"
_G = "cronbox_ops_cookie"
FIELDS = ("sid", "ops", "flash", "login_sent")  # login_sent: cronbox.web.ops.guard.LOGIN_ROUND_TRIP


def derived_keys(label: bytes) -> list[bytes]:
    """Keys for `label`, one per URL-signing key, oldest first (the last one signs). Read per request
    (one scandir: storage.keyring), so a new key is used without a restart."""
    return current_app.extensions["cronbox"].derived_keys(label)


def _serializer() -> URLSafeSerializer:
    return URLSafeSerializer(derived_keys(_KEYS), salt=SALT, signer_kwargs={"digest_method": hashlib.sha256})


def console_path() -> str:
    """Where the console is mounted, as the browser sees it (script root, CRONBOX_OPS_PREFIX, /ops)."""
    return url_for("ops.overview").rstrip("/")


class ConsoleSession:
    """What the cookie says, for this request. `modified` tells the after_request to write it back."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.modified = False

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.modified = True

    def clear(self) -> None:
        """Forget everything, the visit id too: the next form gets a fresh CSRF token."""
        self.data = {}
        self.modified = True

    def sid(self) -> str:
        """This visit's id, made on first use (the first page with a form)."""
        if not self.data.get("sid"):
            self.set("sid", secrets.token_hex(16))
        return self.data["sid"]

    def flash(self, message: str) -> None:
        self.set("flash", [*self.data.get("flash", []), message])

    def pop_flashes(self) -> list[str]:
        messages = self.data.pop("flash", [])
        if messages:
            self.modified = True
        return messages


def _load() -> ConsoleSession:
    value = request.cookies.get(NAME)
    if value:
        try:
            data = _serializer().loads(value)
        except BadSignature:  # tampered, or signed with a key that is gone: a fresh visit
            data = None
        if isinstance(data, dict):
            return ConsoleSession({k: v for k, v in data.items() if k in FIELDS})
    return ConsoleSession({})


def current() -> ConsoleSession:
    """This request's console session (loaded from the cookie on first use)."""
    found = g.get(_G)
    if found is None:
        found = _load()
        setattr(g, _G, found)
    return found


def flash(message: str) -> None:
    """A message for the next console page (the console's own flask.flash)."""
    current().flash(message)


def save(response: Response) -> Response:
    """Write the cookie back if this request changed it; delete it once it is empty."""
    found = g.get(_G)
    if found is None or not found.modified:
        return response
    path = console_path()
    secure = is_https(request, current_app.extensions["cronbox"].settings.trusted_proxies)
    if found.data:
        response.set_cookie(NAME, _serializer().dumps(found.data), path=path, httponly=True, samesite="Lax",
                            secure=secure)
    elif NAME in request.cookies:
        response.delete_cookie(NAME, path=path, httponly=True, samesite="Lax", secure=secure)
    response.vary.add("Cookie")
    return response
