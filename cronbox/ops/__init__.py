"""The operator console at /ops/: one operator, server-rendered pages, no script, no CDN.

What guards it, in the order a request meets it:
- every POST carries a CSRF token (Flask-WTF), checked before anything else;
- every page but login, setup and the stylesheet needs a live operator
  session (cron.operator.sessions: a row per login, ended by logout);
- answers carry no-store, a strict Content-Security-Policy (no script at
  all, styles from our own stylesheet) and frame-ancestors 'none'.
The session cookie is HttpOnly, SameSite=Lax and Secure whenever the request
came over HTTPS (as ProxyFix reads it behind CRONBOX_TRUSTED_PROXIES); its
signing key is derived from the URL-signing key, so there is no extra secret
to keep. Pages live in cronbox/ops/pages/, one module per page.
"""
from __future__ import annotations

import hashlib
import hmac

from flask import Blueprint, Flask, request
from flask.sessions import SecureCookieSessionInterface
from flask_wtf.csrf import CSRFProtect
from werkzeug.middleware.proxy_fix import ProxyFix

bp = Blueprint("ops", __name__, url_prefix="/ops", template_folder="templates", static_folder="static")
csrf = CSRFProtect()
COOKIE = "cronbox_ops"


class ConsoleCookie(SecureCookieSessionInterface):
    """Flask's signed cookie, Secure exactly when the request came over HTTPS."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return request.is_secure


def _secret_keys(app: Flask) -> list[bytes]:
    """Session signing keys derived from the URL-signing keys, newest first (older ones still verify).
    Read from the key folder, not through the app's storage: that would open the runtime (and import
    CRONBOX_HANDLERS) inside the host's factory, before a cron process hands in its own."""
    from storage import keys  # here: libsodium and cryptography load only when the console is on

    ring = keys.load(app.extensions["cronbox"].settings)
    return [hmac.new(key, b"cronbox ops session v1", hashlib.sha256).digest()
            for key in reversed(ring.signing_keys)]


def register(app: Flask, *, url_prefix: str = "/ops") -> None:
    from cronbox import files

    from . import guard, pages, upload  # noqa: F401  (registers the routes on bp)

    if upload.AUTHORIZER not in files.upload_authorizers:  # one list for every app in the process
        files.upload_authorizers.append(upload.AUTHORIZER)

    settings = app.extensions["cronbox"].settings
    keys = _secret_keys(app)
    app.secret_key = keys[0]
    app.config.update(
        SECRET_KEY_FALLBACKS=keys[1:],
        SESSION_COOKIE_NAME=COOKIE,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        WTF_CSRF_CHECK_DEFAULT=False,  # only /ops/ posts need it: guard.py calls csrf.protect()
        WTF_CSRF_TIME_LIMIT=None,  # the token lives as long as the session, which has its own limits
    )
    app.session_interface = ConsoleCookie()
    if settings.trusted_proxies:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=0, x_proto=settings.trusted_proxies)
    csrf.init_app(app)
    app.register_blueprint(bp, url_prefix=url_prefix)
