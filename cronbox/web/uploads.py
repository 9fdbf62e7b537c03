"""Receiving an upload sealed while it streams: `POST /files` and the host's own routes (`seal_upload`).

A raw body is read from the WSGI input stream straight into the sealer; a
multipart form is read part by part (cronbox.web.formstream) and its file part
written into a SealingWriter as it arrives. Never touch `request.files` or
`request.form` for an upload: Werkzeug would spill the file part to a
plaintext temporary file. A body something else already read is refused,
before anything is written, with BodyAlreadyRead (a 500: the route's bug).
A host route under Flask-WTF's CSRFProtect (which reads the form before any
view) takes `@sealed_upload_route`: exempt from CSRFProtect (this route alone),
it checks the host's token itself, from a header or a field before the file part.

Every refusal (malformed body or Content-Length, no owner, two files, over
CRONBOX_UPLOAD_MAX, an interrupted body, a full disk) is an `UploadRefused`
with its HTTP status, raised after whatever was sealed of it is removed: a
refused upload leaves no sealed file and no row.
"""
from __future__ import annotations

import errno
import functools
import logging
import sys
from dataclasses import dataclass
from typing import Callable, TypeVar, cast
from urllib.parse import unquote

from flask import Request, request as current_request
from werkzeug.exceptions import ClientDisconnected, HTTPException, RequestEntityTooLarge
from werkzeug.wsgi import LimitedStream

from cronbox.storage import audit
from cronbox.storage.errors import StorageError, TooLarge
from cronbox.storage.service import Sealed, Storage, owner_text
from cronbox.outbox.core.session_types import AnySession
from cronbox.outbox.core.text import ascii_number

from . import formstream, hostcsrf
from .client import audit_client
from .state import state

log = logging.getLogger("cronbox")
View = TypeVar("View", bound=Callable)

# Bodies that are forms but cannot carry a file: sealing one as "the file" would store a form.
_NOT_A_FILE = ("application/x-www-form-urlencoded",)


class BodyAlreadyRead(RuntimeError):
    """The host's code read this request's body before seal_upload: a bug of the route, never the client's.

    `request.form`/`request.files` (Flask-WTF's CSRFProtect reads them before the
    view), `request.data`, `get_data()`, `get_json()` or a read of `request.stream`
    have already consumed the body, and a multipart file part went to a plaintext
    temporary file on the way. A 500 with this message, logged: use
    `@sealed_upload_route` on the route and read nothing of the body
    before seal_upload.
    """


class UploadRefused(HTTPException):
    """An upload refused for what the client sent (400, 411, 413) or a full disk (507).

    An HTTPException, so a host route may let it propagate (Flask answers with
    `code` and `description`) or catch it and answer its own way. `.status` is
    the same number as `.code`.
    """

    def __init__(self, message: str, status: int):
        super().__init__(description=message)
        self.code = status

    @property
    def status(self) -> int:
        return self.code or 400

    @property
    def message(self) -> str:
        return self.description or ""


@dataclass(frozen=True)
class Received:
    """A sealed file complete on disk, not yet recorded, with what the request said about it."""

    sealed: Sealed
    owner: str
    fields: dict[str, str]
    filename: str
    content_type: str


@dataclass(frozen=True)
class SealedUpload:
    """What `seal_upload` returns: the new file's id and size, the form's text fields, the file's name and type."""

    file_id: str
    size: int
    fields: dict[str, str]
    filename: str
    content_type: str


def storage_for_app() -> Storage:
    """The Storage of the current app's cronbox (RuntimeError when Cronbox().init_app was not called)."""
    return state().storage


def request_client() -> audit.Client:
    """The current request's client as the audit trail names it (its IP through the app's
    CRONBOX_TRUSTED_PROXIES, its User-Agent): give it as `client=` to the app's sealed storage
    (`signed_url`, `revoke`) from your own routes, so the entry says who asked."""
    return audit_client(current_request, storage_for_app().settings.trusted_proxies)


def receive(st: Storage, req: Request, *, owner: str | None = None, owner_field: str = "owner") -> Received:
    """Seal the request's upload (raw body or multipart/form-data); UploadRefused for anything refused.

    The owner is `owner` when given, else the form's `owner_field` (multipart)
    or the X-Cronbox-Owner header (raw body); it is checked before the first
    byte is sealed whenever it is known by then.
    """
    _refuse_a_read_body(req)
    limit = st.settings.upload_max
    length = _declared_length(req)
    if length is not None and length > limit:
        raise UploadRefused(f"the file is larger than the limit of {limit} bytes", 413)
    if length is None and "wsgi.input_terminated" not in req.environ:
        raise UploadRefused("send a Content-Length (or a chunked body)", 411)
    try:
        if owner is not None:
            owner = _owner(owner)
        if req.mimetype == "multipart/form-data":
            return _receive_form(st, req, limit, owner, owner_field)
        if req.mimetype in _NOT_A_FILE or req.mimetype.startswith("multipart/"):
            raise StorageError(f"a {req.mimetype} body is not a file: send the file as the raw body "
                               "or in a multipart/form-data form")
        return _receive_body(st, req, limit, owner)
    except TooLarge as exc:
        raise UploadRefused(str(exc), 413) from None
    except RequestEntityTooLarge:
        raise UploadRefused("a form field is too large", 413) from None
    except ClientDisconnected:
        raise UploadRefused("the upload was interrupted", 400) from None
    except (StorageError, ValueError) as exc:
        raise UploadRefused(str(exc), 400) from None
    except OSError as exc:  # the sealed file's disk is full (or over quota): nothing of it stays (discarded)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        log.error("files: upload refused: no space left for sealed files (%s)", exc.strerror)
        raise UploadRefused("no space left on the server to store the file; try again later", 507) from None


def sealed_upload_route(view: View | None = None, *, csrf=None):
    """Decorate a host route that calls seal_upload (under the route decorator: `@app.post(...)` above):
    `@sealed_upload_route`, with or without the host's Flask-WTF CSRFProtect.

    CSRFProtect would read the whole form, file and all, into a plaintext
    temporary file before the view; so the route is exempted from it (the app's
    CSRFProtect, `app.extensions["csrf"]`, found at each request before its check:
    cronbox.web.hostcsrf) and gets the same check here, before the view runs: the
    host's token from its X-CSRFToken / X-CSRF-Token header, or from its
    `csrf_token` field sent *before* the file part (a token after the file is
    not seen: refused as missing). A refusal is Flask-WTF's CSRFError (400),
    nothing read of the file, nothing stored. Without CSRFProtect nothing is
    checked. The exemption is this route's alone: the host's other routes keep
    CSRFProtect, whatever their names. `csrf=` (the host's CSRFProtect) is not
    needed; given, the route is exempted from it at once. The decorator written
    above the route decorator registers the bare view: a request to it is
    refused before its body is read (hostcsrf.CsrfNotChecked, a 500, logged).
    """
    def decorate(view: View) -> View:
        @functools.wraps(view)
        def receiving(*args, **kwargs):
            _refuse_a_read_body(current_request)
            hostcsrf.check_host_token(current_request)
            return view(*args, **kwargs)

        hostcsrf.take_over(receiving, view)
        if csrf is not None:
            csrf.exempt(receiving)
        return cast(View, receiving)

    return decorate(view) if view is not None else decorate


def seal_upload(request: Request | None = None, *, session: AnySession, owner: str | None = None,
                owner_field: str = "owner", storage: Storage | None = None, client: audit.Client | None = None,
                actor: str | None = None) -> SealedUpload:
    """Seal the current request's upload while it streams and add its row to `session` (not committed).

    For a host route: `request` defaults to Flask's, `storage` to the app's
    (set up by Cronbox().init_app). `owner`: the file's owner (an opaque id such as `patient:7`);
    without it, the form's `owner_field` text field (sent before the file part) names it. `client`:
    who the audit entry names (default: `request_client()`); `actor`: the operator or user the audit
    entry records, if any. Returns the sealed upload: `file_id`, `size`, `filename`, `content_type`,
    `fields` (the form's text fields). Raises UploadRefused (400/411/
    413/507) with nothing kept; `BodyAlreadyRead` or `CsrfNotChecked` (500s: the route's bug) before
    anything is written. Commit `session` soon: the sealed file is on
    disk before its row, and `storage sweep` removes a file whose row has not
    committed after an hour (a rollback leaves just such an orphan).
    """
    # The request object behind Flask's proxy (LocalProxy's documented method; typed as the Request).
    req = request if request is not None else current_request._get_current_object()  # type: ignore[attr-defined]
    _refuse_a_read_body(req)  # the likelier mistake first: its message says what read the body
    hostcsrf.refuse_unchecked(req)
    st = storage if storage is not None else storage_for_app()
    received = receive(st, req, owner=owner, owner_field=owner_field)
    if client is None:
        client = audit_client(req, st.settings.trusted_proxies)
    file_id = record(st, session, received, client=client, actor=actor)
    return SealedUpload(file_id, received.sealed.size, received.fields, received.filename, received.content_type)


def record(st: Storage, session: AnySession, received: Received, *, client: audit.Client, actor: str | None) -> str:
    """Add the received file's row (and its audit entry) to `session`; the sealed file is removed if that fails."""
    try:
        return st.add(session, received.sealed, owner=received.owner, client=client, actor=actor)
    except StorageError as exc:
        st.discard(received.sealed)
        raise UploadRefused(str(exc), 400) from None
    except BaseException:
        st.discard(received.sealed)
        raise


def _refuse_a_read_body(req: Request) -> None:
    """BodyAlreadyRead, before anything is written, when something else read this request's body first.

    The sign is the position of Werkzeug's LimitedStream, which every body gets once the request has
    a length limit. Where it has none and the server ends the input itself (`wsgi.input_terminated`:
    a chunked body; every body under some servers), Werkzeug would hand out the server's own stream,
    which keeps no position: a part read of it could not be seen, and the rest would be sealed as the
    file. So such a request gets a limit of its own first (Flask's per-request `max_content_length`,
    this request only), which makes its stream a LimitedStream; a stream that is not one by then was
    opened before seal_upload, and is refused the same way. Our own form reader, started by a check
    before the view, is no such sign: it is resumed.
    """
    if formstream.started_reader(req) is not None:
        return
    terminated = "wsgi.input_terminated" in req.environ
    if terminated and req.max_content_length is None:
        req.max_content_length = sys.maxsize  # the upload's own limit is applied as it is sealed
    stream = req.stream
    limited = isinstance(stream, LimitedStream)
    if terminated and not limited:
        log.error("files: seal_upload in %s: the request's stream was opened before it; refused", req.endpoint)
        raise BodyAlreadyRead(
            f"seal_upload: the stream of this request to {req.endpoint} was opened before it (request.form, "
            "request.files, request.data, get_data(), get_json() or request.stream), and a body the server ends "
            "itself (chunked) keeps no position to show whether it was read: read nothing of the request before "
            "seal_upload, or set the app's MAX_CONTENT_LENGTH.")
    if limited and stream.tell() > 0:
        log.error("files: seal_upload in %s: the request body was already read (request.form, files, data or "
                  "get_data before it); refused", req.endpoint)
        raise BodyAlreadyRead(
            f"seal_upload: the body of this request to {req.endpoint} was already read before it (request.form, "
            "request.files, request.data, get_data(), get_json() or the stream, e.g. by Flask-WTF's CSRFProtect), "
            "so a file part may have gone to a plaintext temporary file. Decorate the route with "
            "@cronbox.sealed_upload_route (under the route decorator) and read nothing of the body before seal_upload.")


def _declared_length(req: Request) -> int | None:
    """The body length the client declared (None when absent); UploadRefused when it is not a number.

    Read from the raw CONTENT_LENGTH, because Werkzeug turns a value that is
    not a number (`-1`, `abc`, `1e3`) into 0, which would seal an empty file
    and answer 201. HTTP allows only ASCII digits (RFC 9110, 8.6).
    """
    raw = req.environ.get("CONTENT_LENGTH")
    if raw is None or raw == "":
        return None
    length = ascii_number(raw, 30)  # 30 digits: far past any limit, so a 413
    if length is None:
        raise UploadRefused("Content-Length must be a number of bytes (digits only)", 400)
    return length


def _owner(value: str | None, field: str = "owner") -> str:
    """Checked before a byte is sealed, with the rule Storage.add applies (a bad owner is a 400, not a 500)."""
    if not value:
        raise StorageError(f"say whose file this is: X-Cronbox-Owner header (raw body) or an `{field}` form field")
    return owner_text(value)


def _receive_body(st: Storage, req: Request, limit: int, owner: str | None) -> Received:
    """Raw body: the file's bytes; its name in X-Cronbox-Filename (percent-encoded UTF-8), type in Content-Type.

    An empty body is refused (400) before a file is opened: an empty file holds nothing worth
    keeping, and it is what a body read before seal_upload looks like when it came chunked to an app
    without MAX_CONTENT_LENGTH. Werkzeug then hands over the server's own input stream, which keeps
    no position to tell a read body by (with a Content-Length or a MAX_CONTENT_LENGTH it is a
    LimitedStream, and _refuse_a_read_body sees its position). A part read of such a body cannot be
    seen at all: the rest would be sealed as the file.
    """
    owner = owner or _owner(req.headers.get("X-Cronbox-Owner"))
    name = unquote(req.headers.get("X-Cronbox-Filename", "upload"), errors="strict")
    kind = req.mimetype or "application/octet-stream"
    first = req.stream.read(formstream.CHUNK)
    if not first:
        log.warning("files: upload to %s refused: an empty body (or one read before seal_upload)", req.endpoint)
        raise StorageError("the upload is empty: no byte of the file arrived (if the route read the body "
                           "before seal_upload, read nothing of it)")
    with st.writer(filename=name, content_type=kind, limit=limit) as writer:
        writer.write(first)
        writer.fill_from(req.stream)
        sealed = writer.finish()
    return Received(sealed, owner, {}, name, kind)


def _receive_form(st: Storage, req: Request, limit: int, owner: str | None, owner_field: str) -> Received:
    """multipart/form-data with one file part (sealed as it streams) and text fields (the owner's among them).

    Read with cronbox.web.formstream, resuming where a check before the view (a CSRF
    token in a field before the file) stopped: an owner field before the file is
    checked before the first byte is sealed, one after it once the body ended.
    """
    reader = formstream.reader_for(req)
    fields = reader.fields_before_file()
    if reader.file is None:
        raise StorageError("no complete file part in the form")
    if owner is None and owner_field in fields:
        owner = _owner(fields.get(owner_field), owner_field)
    part = reader.file
    writer = st.writer(filename=part.filename or "upload",
                       content_type=part.headers.get("content-type") or "application/octet-stream", limit=limit)
    try:
        for data in reader.file_data():
            writer.write(data)
        fields = reader.rest()
        owner = owner or _owner(fields.get(owner_field), owner_field)
        sealed = writer.finish()
    except BaseException:
        writer.discard()
        raise
    return Received(sealed, owner, {name: fields[name] for name in fields}, writer.filename, writer.content_type)
