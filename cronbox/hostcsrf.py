"""Keeping a host's app-wide CSRF check (Flask-WTF's CSRFProtect) off cronbox's own routes.

A host's CSRFProtect guards every POST of its app from an app-wide before_request. On
cronbox's routes it would refuse the console's forms (they carry the console's own token,
cronbox.ops.csrf), POST /files with a bearer token and POST /cron/tick (never sent by a
browser on its own, so CSRF does not apply), and it would read an upload's body as a form
before cronbox streams and seals it. So each cronbox blueprint that takes POSTs asks the
host's CSRFProtect, when there is one, to leave that blueprint alone: from a
url_value_preprocessor, the only hook of a blueprint that runs before the app's own
before_request functions, so the order of `csrf.init_app(app)` and `cronbox.init_app(app)`
does not matter. The host's own routes stay protected exactly as before.
"""
from __future__ import annotations

from flask import Blueprint, current_app


def exempt_from_host_csrf(bp: Blueprint) -> None:
    @bp.url_value_preprocessor
    def _leave_to_cronbox(endpoint, values) -> None:
        protect = current_app.extensions.get("csrf")
        if type(protect).__module__.startswith("flask_wtf") and callable(getattr(protect, "exempt", None)):
            protect.exempt(bp)  # a set: once is enough, again costs nothing
