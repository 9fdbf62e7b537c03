"""Uploading a sealed file from the console's Files page: POST <console>/upload.

The upload itself is cronbox.web.files' streamed, sealed upload (`sealed_upload`,
the same code as POST /files); this module only says where the browser goes
afterwards. It is a route of the console rather than POST /files because the
console's cookie is scoped to the console's path: a browser does not send it
to /files. The blueprint's before_request has already checked the operator's
session and the CSRF token: a field the form sends before its file part
(read by cronbox.web.formstream up to the file, which is then sealed as it
streams) or an X-CSRF-Token header; never the query string, which access logs
keep. A token after the file is not seen: the upload is refused, nothing kept.
"""
from __future__ import annotations

from flask import Response, redirect, url_for

from cronbox.web.files import sealed_upload

from . import bp, cookie
from .guard import act, operator_name

def back_to_the_console(file_id: str | None, error: str | None, status: int) -> Response:
    if error is not None:
        act("files.upload", None, outcome="refused", detail=error)
        cookie.flash(f"Upload refused: {error}.")
        return redirect(url_for("ops.files"), code=303)
    act("files.upload", file_id)
    cookie.flash(f"Sealed as file {file_id}.")
    return redirect(url_for("ops.files", file=file_id), code=303)


@bp.post("/upload")
def files_upload():
    return sealed_upload(operator_name(), back_to_the_console)
