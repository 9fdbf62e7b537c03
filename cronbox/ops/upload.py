"""Uploading a sealed file from the console's Files page (POST /files with the operator's session).

The upload itself is cronbox.files' streamed, sealed upload; this module only
says who may use it from a browser and where the browser goes afterwards. The
CSRF token rides in the query string of the form's action: the body is sealed
while it streams, so the authorization cannot wait for a form field that may
arrive after the file. (The token is bound to the session cookie, useless
without it, so its place in an access log gives nothing away.)
"""
from __future__ import annotations

from flask import Request, Response, flash, redirect, session, url_for
from flask_wtf.csrf import validate_csrf
from wtforms import ValidationError

from cron.operator import credentials, sessions
from outbox.core import clock
from outbox.core.db import in_transaction
from outbox.core.settings import Settings
from cronbox.state import runtime
from cronbox.files import UploadAuthorizer

from .guard import act

PRINCIPAL = "operator"


def operator_session(req: Request, settings: Settings) -> str | None:
    if not session.get("ops"):
        return None
    try:
        validate_csrf(req.args.get("csrf_token", ""))
    except ValidationError:
        return None
    fingerprint = credentials.fingerprint(settings)
    current = in_transaction(runtime().sessions,
                             lambda s: sessions.check(s, session.get("ops"), clock.utcnow(), fingerprint))
    return PRINCIPAL if current else None


def back_to_the_console(file_id: str | None, error: str | None, status: int) -> Response:
    if error is not None:
        act("files.upload", None, outcome="refused", detail=error)
        flash(f"Upload refused: {error}.")
        return redirect(url_for("ops.files"), code=303)
    act("files.upload", file_id)
    flash(f"Sealed as file {file_id}.")
    return redirect(url_for("ops.files", file=file_id), code=303)


AUTHORIZER = UploadAuthorizer(PRINCIPAL, credentials.is_configured, operator_session, back_to_the_console)
