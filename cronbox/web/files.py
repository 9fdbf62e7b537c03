"""`GET|HEAD /files/<token>` (signed download) and `POST /files` (streamed, sealed upload).

A download passes, in order: the token's signature, age and `exp`; the grant
(exists, not revoked, not expired, uses left, or a repeat of the same token
by the same client within the same-use window: storage.grants); the sealed file's wrapped key, header and last
chunk (so the promised length is proven before a header is sent); the Range.
Only then is a use counted (in a short transaction, closed before the first
byte) and the body streamed chunk by chunk, each authenticated before it is
sent. A chunk failing after the headers went out raises inside the body, which
makes any WSGI server drop the connection: the client sees a short response,
never a complete-looking wrong file.

Answers are deliberately dull: an expired but authentic link gets 410 "link
expired"; every other refusal (tampered, future-dated, unknown, revoked, used
up) the same 404. Every answer under /files carries no-store, nosniff,
no-referrer and a sandboxing CSP. Each attempt is audited with its reason.

Uploads are sealed while they arrive, received by cronbox.web.uploads (shared with
the host's own routes, `seal_upload`); this module adds who may upload and
how the answer looks. What the web server may buffer before Python sees the
body is documented in the README.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

from flask import Blueprint, Flask, Request, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import PathConverter

from cronbox.outbox.core import clock
from cronbox.outbox.core.settings import Settings
from cronbox.outbox.core.transactions import in_transaction
from cronbox.storage import audit, grants, refusals
from cronbox.storage.errors import GrantInvalid, IntegrityError, UnknownKey
from cronbox.storage.keys import check_key_folder
from cronbox.storage.service import OpenedFile
from cronbox.storage.tokens import TokenRefused

from . import hostauth
from .state import runtime
from .auth import bearer_matches
from .hostcsrf import exempt_from_host_csrf
from .disposition import content_disposition, content_type
from .ranges import plan
from .uploads import UploadRefused, receive, record, request_client, storage_for_app

log = logging.getLogger("cronbox")
bp = Blueprint("files", __name__)
exempt_from_host_csrf(bp)  # POST /files: a bearer token, and a body only we may read

SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; sandbox",
}
_PAGE = ("<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title></head>"
         "<body><h1>{title}</h1><p>{text}</p></body></html>\n")
NOT_FOUND = _PAGE.format(title="Not found", text="There is nothing here.")
EXPIRED = _PAGE.format(title="Link expired", text="This download link has expired. Ask for a new one.")
UNAVAILABLE = _PAGE.format(title="File unavailable", text="This file cannot be served right now. "
                                                           "The problem has been recorded.")


def _page(body: str, status: int) -> Response:
    return Response(body, status=status, mimetype="text/html")


def _audit(sessions, action: str, outcome: str, **fields) -> None:
    """An audit entry in its own short transaction (refusals and body ends have no other), and a log line."""
    in_transaction(sessions, lambda s: audit.record(s, action, outcome, **fields))
    _log(action, outcome, fields)


def _log(action: str, outcome: str, fields: dict) -> None:
    """One operator log line: opaque ids and a prefix of the jti's hash, never the token or a name."""
    jti, byte_range = fields.get("jti"), fields.get("byte_range")
    log.info("files: %s %s status=%s file=%s grant=%s jti#%s range=%s bytes=%s", action, outcome,
             fields.get("status"), fields.get("file_id") or "-", fields.get("grant_id") or "-",
             audit.jti_hash(jti)[:12] if jti else "-", f"{byte_range[0]}-{byte_range[1]}" if byte_range else "-",
             fields.get("bytes_sent", "-"))


def _refuse_unsigned(sessions, reason: str, status: int, client: audit.Client, method: str) -> None:
    """A token nobody signed: audited and logged like any refusal up to a share per client, then only
    counted (storage.refusals), with one log line when the counting starts."""
    now = clock.utcnow()
    done = in_transaction(sessions, lambda s: refusals.record(s, reason, status=status, client=client,
                                                               detail=method, now=now))
    if done == "recorded":
        _log("redeem", reason, {"status": status})
    elif done == "counting":
        log.warning("files: over %d unsigned or malformed tokens from one client in %d min: counting the rest, "
                    "`storage sweep` records their number", refusals.RECORDED, refusals.WINDOW // 60)


@bp.after_request
def _security_headers(response: Response) -> Response:
    """Only this blueprint's answers: the host's own pages keep their headers."""
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


@bp.errorhandler(404)
def _not_found(error: HTTPException):
    return _page(NOT_FOUND, 404)


class AnyRest(PathConverter):
    """Whatever follows /files/, leading slashes too (Werkzeug's `path` refuses those)."""
    regex = ".*"
    part_isolating = False  # it spans slashes


@bp.route("/files/<cronbox_rest:rest>", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"],
          merge_slashes=False)
def _no_such_file(rest: str = ""):
    """Route misses under /files (`/files/a/b`, encoded slashes) look like any refused token, from a
    route of our own: an app-wide 404 handler would replace the host's."""
    return _page(NOT_FOUND, 404)


# --- downloads -----------------------------------------------------------------------------------

class DownloadBody:
    """The WSGI body of one download: authenticated chunks, then an audit entry with the bytes sent.

    The first part was read (and authenticated) by the view, before the status
    and headers were chosen: a file failing there gets a proper 500 page. Only a
    later chunk can fail here, after the headers went out.

    `close()` is what every WSGI server calls when a response ends, completed,
    aborted by the client or by an integrity error: it closes the file and
    records how many bytes actually went out.
    """

    def __init__(self, opened: OpenedFile, first: bytes, rest: Iterator, *, on_close: Callable[[int, str], None],
                 on_integrity_error: Callable[[str], None]):
        self._opened = opened
        self._first, self._rest = first, rest
        self._on_close = on_close
        self._on_integrity_error = on_integrity_error
        self.sent = 0
        self.outcome = "aborted"
        self._closed = False

    def __iter__(self):
        try:
            if self._first:
                yield self._first
                self.sent += len(self._first)
            for part in self._rest:
                data = bytes(part)  # the reader reuses its buffer; the server may hold on to this
                yield data
                self.sent += len(data)  # counted once the server came back for more: it was written
            self.outcome = "complete"
        except IntegrityError as exc:
            self.outcome = "integrity"
            self._on_integrity_error(str(exc))
            raise  # after the headers: the server must drop the connection

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._opened.close()
        try:
            self._on_close(self.sent, self.outcome)
        except Exception:  # the bytes are gone either way; a lost audit line must not raise into the server
            log.exception("files: could not record the end of a download")


@bp.route("/files/<token>", methods=["GET", "HEAD"])
def download(token: str):
    st = storage_for_app()
    sessions = runtime().sessions
    client = request_client()
    method = request.method
    try:
        claims = st.tokens().verify(token)
    except TokenRefused as refused:
        status = 410 if refused.expired else 404
        claims = refused.claims
        if refused.reason in refusals.UNSIGNED:
            _refuse_unsigned(sessions, refused.reason, status, client, method)
        else:
            _audit(sessions, "redeem", refused.reason, status=status, grant_id=claims.grant_id if claims else None,
                   jti=claims.jti if claims else None, client=client, detail=method)
        return _page(EXPIRED, 410) if refused.expired else _page(NOT_FOUND, 404)

    use_key = grants.use_key_for(claims.jti, client.ip, client.user_agent)  # one client's use of this token
    fields = {"grant_id": claims.grant_id, "jti": claims.jti, "client": client}
    try:
        decision = in_transaction(sessions, lambda s: grants.check(s, claims.grant_id, use_key, clock.utcnow()))
    except GrantInvalid as refused:
        _audit(sessions, "redeem", str(refused), status=404, detail=method, **fields)
        return _page(NOT_FOUND, 404)
    row = decision.file
    fields.update(file_id=row.id, subject=decision.grant.subject)

    try:
        opened = st.open(row)
    except (IntegrityError, UnknownKey) as exc:
        st.report_integrity(row.id, str(exc))
        _audit(sessions, "redeem", "integrity", status=500, detail=method, **fields)
        return _page(UNAVAILABLE, 500)

    try:
        size = opened.size
        answer = plan(request.headers.get("Range"), request.headers.get("If-Range"), opened.etag, size)
        headers = {"Accept-Ranges": "bytes", "ETag": opened.etag, "X-Accel-Buffering": "no"}
        if answer.status == 416:
            opened.close()
            _audit(sessions, "redeem", "unsatisfiable", status=416, detail=method, **fields)
            return Response(None, status=416, headers={**headers, "Content-Range": answer.content_range(size),
                                                       "Content-Length": "0"})
        byte_range = (answer.start, answer.stop - 1) if answer.length else None
        # The first chunk of the range is authenticated now, before a use is counted and before any
        # header is sent: raised inside the body it would reach the WSGI server before the status line
        # and become the server's bare 500 (no no-store, no CSP) logged as a 200 that sent 0 bytes.
        rest = opened.iter_range(answer.start, answer.stop)
        try:
            first = bytes(next(rest)) if answer.length else b""
        except IntegrityError as exc:
            opened.close()
            st.report_integrity(row.id, str(exc))
            _audit(sessions, "redeem", "integrity", status=500, byte_range=byte_range, detail=method, **fields)
            return _page(UNAVAILABLE, 500)
        if method == "GET":
            now = clock.utcnow()

            def count(session) -> str:
                outcome = "granted" if grants.count_use(session, claims.grant_id, use_key, now) else "same-use"
                audit.record(session, "redeem", outcome, status=answer.status, byte_range=byte_range, detail=method,
                             **fields)
                return outcome

            _log("redeem", in_transaction(sessions, count), {"status": answer.status, "byte_range": byte_range,
                                                               **fields})
        else:
            _audit(sessions, "redeem", "head", status=answer.status, byte_range=byte_range, detail=method, **fields)
    except GrantInvalid as refused:
        opened.close()
        _audit(sessions, "redeem", str(refused), status=404, detail=method, **fields)
        return _page(NOT_FOUND, 404)
    except BaseException:
        opened.close()
        raise

    headers.update({
        "Content-Type": content_type(opened.content_type),
        "Content-Disposition": content_disposition(opened.name),
        "Content-Length": str(answer.length),
    })
    if answer.status == 206:
        headers["Content-Range"] = answer.content_range(size)
    if method == "HEAD":
        opened.close()
        return Response(None, status=answer.status, headers=headers)

    def on_close(sent: int, outcome: str) -> None:
        _audit(sessions, "serve", outcome, status=answer.status, byte_range=byte_range, bytes_sent=sent, **fields)

    body = DownloadBody(opened, first, rest, on_close=on_close,
                        on_integrity_error=lambda error: st.report_integrity(row.id, error))
    return Response(body, status=answer.status, headers=headers, direct_passthrough=True)


# --- uploads -------------------------------------------------------------------------------------

def bearer_upload_token(req: Request, settings: Settings) -> str | None:
    """`Authorization: Bearer <CRONBOX_UPLOAD_TOKEN>`, compared in constant time (cronbox.web.auth)."""
    return "upload-token" if bearer_matches(settings.upload_token) else None


@dataclass(frozen=True)
class UploadAuthorizer:
    """One way to be allowed to upload. `check` returns a principal (recorded in the audit) or None;
    `configured` says whether this way exists at all (with none configured, POST /files is a 404).
    `reply`, when set, makes the answer for this principal from (file id, error, status), e.g. a
    redirect back to a page instead of JSON. A browser-facing authorizer must bring CSRF protection
    with it, which a bearer token, never sent automatically, does not need. (The operator console
    has its own upload route under its own path, where its cookie goes: cronbox.web.ops.upload.)"""

    name: str
    configured: Callable[[Settings], bool]
    check: Callable[[Request, Settings], str | None]
    reply: Callable[[str | None, str | None, int], Response] | None = None


def _has_upload_hook(settings: Settings) -> bool:
    return current_app.extensions["cronbox"].upload_operator is not None


upload_authorizers: list[UploadAuthorizer] = [
    UploadAuthorizer("upload-token", lambda settings: bool(settings.upload_token), bearer_upload_token),
    # The host's logged-in users (init_app(upload_operator=...)), with cronbox.upload_csrf_token().
    UploadAuthorizer("upload-operator", _has_upload_hook, hostauth.upload_operator)]


def _json_error(message: str, status: int, **headers) -> Response:
    response = jsonify(error=message)
    response.status_code = status
    response.headers.update(headers)
    return response


@bp.route("/files", methods=["POST"])
def upload():
    st = storage_for_app()
    settings = st.settings
    ways = [a for a in upload_authorizers if a.configured(settings)]
    if not ways:
        return _page(NOT_FOUND, 404)  # no way to authorize an upload is configured: the endpoint is off
    try:
        found = next(((a, who) for a in ways for who in [a.check(request, settings)] if who), None)
    except hostauth.UploadForbidden as refused:
        return _json_error(refused.message, 403)
    if found is None:
        return _json_error("authorization required", 401, **{"WWW-Authenticate": 'Bearer realm="cronbox"'})
    authorizer, principal = found
    return sealed_upload(principal, authorizer.reply)


def sealed_upload(principal: str, reply: Callable[[str | None, str | None, int], Response] | None = None
                  ) -> Response:
    """Seal this request's body as a file uploaded by `principal`, who is already authorized. `reply`
    makes the answer from (file id, error, status) instead of JSON: the console's own upload route
    sends the browser back to its Files page (cronbox.web.ops.upload)."""
    st = storage_for_app()

    def refuse(message: str, status: int) -> Response:
        return reply(None, message, status) if reply else _json_error(message, status)

    client = request_client()
    try:
        received = receive(st, request)
    except UploadRefused as refused:
        return refuse(refused.message, refused.status)
    try:
        file_id = in_transaction(runtime().sessions, lambda s: record(st, s, received, client=client, actor=principal))
    except UploadRefused as refused:
        return refuse(refused.message, refused.status)
    except BaseException:
        st.discard(received.sealed)  # the commit failed: the row is not there, so neither may the file be
        raise
    if reply:
        return reply(file_id, None, 201)
    return jsonify(id=file_id, size=received.sealed.size), 201


def register(app: Flask, *, url_prefix: str = "") -> None:
    """Refuse to start with an unsafe key folder; mount the blueprint (at CRONBOX_FILES_PREFIX)."""
    check_key_folder(app.extensions["cronbox"].settings)
    app.url_map.converters.setdefault("cronbox_rest", AnyRest)  # a name of our own: no host rule changes
    app.register_blueprint(bp, url_prefix=url_prefix or None)
