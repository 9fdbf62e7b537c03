"""The operator console at /ops/ (CRONBOX_OPS_PREFIX moves it): one operator, server-rendered pages, no script.

What guards it, in the order a request meets it (guard.py):
- every unsafe request carries the console's CSRF token (cronbox.web.ops.csrf),
  checked before anything else;
- every page but login, setup and the stylesheet needs a live operator
  session (cron.operator.sessions: a row per login, ended by logout);
- with the host's `console_operator` hook (cronbox.web.hostauth) the host's login
  replaces the password and the operator session: the hook names the operator
  on every request, the password pages are gone, the CSRF token stays;
- answers carry no-store, a strict Content-Security-Policy (no script at
  all, styles from our own stylesheet) and frame-ancestors 'none'.

It lives inside the host's app and changes nothing of it: its session is its
own cookie `cronbox_ops` on the console's path (cronbox.web.ops.cookie), signed
with a key derived from the URL-signing keys, never the host's SECRET_KEY,
flask.session or session interface; its CSRF check, error pages, template
helpers and headers belong to this blueprint only; proxies are believed per
request (cronbox.web.client), the host's wsgi_app is not wrapped. Templates live
in templates/cronbox_ops/, a folder name no host template shadows. Pages live
in cronbox/ops/pages/, one module per page.
"""
from __future__ import annotations

from flask import Blueprint, Flask
from werkzeug.routing import BaseConverter

from cronbox.web.hostcsrf import exempt_from_host_csrf
from cronbox.outbox.core.paging import ID_DIGITS

bp = Blueprint("ops", __name__, url_prefix="/ops", template_folder="templates", static_folder="static")
exempt_from_host_csrf(bp)  # the console checks its own token (cronbox.web.ops.csrf)


class RowId(BaseConverter):
    """A row id in a console path (`<cronbox_id:...>`): ASCII digits only. Werkzeug's `int` takes other
    scripts' digits too (/ops/once/١٢ would be run 12)."""
    regex = f"[0-9]{{1,{ID_DIGITS}}}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value) -> str:
        return str(int(value))


def register(app: Flask, *, url_prefix: str = "/ops") -> None:
    from . import guard, pages, upload  # noqa: F401  (registers the routes on bp)

    app.url_map.converters.setdefault("cronbox_id", RowId)  # a name of our own: no host rule changes
    app.register_blueprint(bp, url_prefix=url_prefix)
