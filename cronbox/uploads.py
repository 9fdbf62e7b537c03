"""Receiving an upload sealed while it streams: `POST /files` and the host's own routes (`seal_upload`).

A raw body is read from the WSGI input stream straight into the sealer; a
multipart form's file part is written into a SealingWriter acting as
Werkzeug's stream factory. Never touch `request.files` or `request.form` for
an upload: Werkzeug would spill a part over 500 KiB to a plaintext temporary
file before any route sees it.

Every refusal (malformed body or Content-Length, no owner, two files, over
CRONBOX_UPLOAD_MAX, an interrupted body, a full disk) is an `UploadRefused`
with its HTTP status, raised after whatever was sealed of it is removed: a
refused upload leaves no sealed file and no row.
"""
from __future__ import annotations

import errno
import logging
import re
from dataclasses import dataclass
from urllib.parse import unquote

from flask import Request, request as current_request
from sqlalchemy.orm import Session
from werkzeug.exceptions import ClientDisconnected, HTTPException, RequestEntityTooLarge
from werkzeug.formparser import FormDataParser

from storage import audit
from storage.errors import StorageError, TooLarge
from storage.service import Sealed, Storage, owner_text

from .client import client_ip
from .state import state

log = logging.getLogger("cronbox")

_DIGITS = re.compile(r"[0-9]{1,30}")
# Werkzeug applies this both to each text field and to its parse buffer (fed 64 KiB at a time).
MAX_FORM_FIELDS = 256 * 1024
MAX_FORM_PARTS = 32
# Bodies that are forms but cannot carry a file: sealing one as "the file" would store a form.
_NOT_A_FILE = ("application/x-www-form-urlencoded",)


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
        return self.code

    @property
    def message(self) -> str:
        return self.description


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


def receive(st: Storage, req: Request, *, owner: str | None = None, owner_field: str = "owner") -> Received:
    """Seal the request's upload (raw body or multipart/form-data); UploadRefused for anything refused.

    The owner is `owner` when given, else the form's `owner_field` (multipart)
    or the X-Cronbox-Owner header (raw body); it is checked before the first
    byte is sealed whenever it is known by then.
    """
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


def seal_upload(request: Request | None = None, *, session: Session, owner: str | None = None,
                owner_field: str = "owner", storage: Storage | None = None, client: audit.Client | None = None,
                actor: str | None = None) -> SealedUpload:
    """Seal the current request's upload while it streams and add its row to `session` (not committed).

    For a host route: `request` defaults to Flask's, `storage` to the app's
    (set up by Cronbox().init_app). Raises UploadRefused (400/411/
    413/507) with nothing kept. Commit `session` soon: the sealed file is on
    disk before its row, and `storage sweep` removes a file whose row has not
    committed after an hour (a rollback leaves just such an orphan).
    """
    req = request if request is not None else current_request._get_current_object()
    st = storage if storage is not None else storage_for_app()
    received = receive(st, req, owner=owner, owner_field=owner_field)
    if client is None:
        client = audit.Client(client_ip(req, st.settings.trusted_proxies), req.headers.get("User-Agent"))
    file_id = record(st, session, received, client=client, actor=actor)
    return SealedUpload(file_id, received.sealed.size, received.fields, received.filename, received.content_type)


def record(st: Storage, session: Session, received: Received, *, client: audit.Client, actor: str | None) -> str:
    """Add the received file's row (and its audit entry) to `session`; the sealed file is removed if that fails."""
    try:
        return st.add(session, received.sealed, owner=received.owner, client=client, actor=actor)
    except StorageError as exc:
        st.discard(received.sealed)
        raise UploadRefused(str(exc), 400) from None
    except BaseException:
        st.discard(received.sealed)
        raise


def _declared_length(req: Request) -> int | None:
    """The body length the client declared (None when absent); UploadRefused when it is not a number.

    Read from the raw CONTENT_LENGTH, because Werkzeug turns a value that is
    not a number (`-1`, `abc`, `1e3`) into 0, which would seal an empty file
    and answer 201. HTTP allows only ASCII digits (RFC 9110, 8.6).
    """
    raw = req.environ.get("CONTENT_LENGTH")
    if raw is None or raw == "":
        return None
    if not _DIGITS.fullmatch(raw):
        raise UploadRefused("Content-Length must be a number of bytes (digits only)", 400)
    return int(raw)


def _owner(value: str | None, field: str = "owner") -> str:
    """Checked before a byte is sealed, with the rule Storage.add applies (a bad owner is a 400, not a 500)."""
    if not value:
        raise StorageError(f"say whose file this is: X-Cronbox-Owner header (raw body) or an `{field}` form field")
    return owner_text(value)


def _receive_body(st: Storage, req: Request, limit: int, owner: str | None) -> Received:
    """Raw body: the file's bytes; its name in X-Cronbox-Filename (percent-encoded UTF-8), type in Content-Type."""
    owner = owner or _owner(req.headers.get("X-Cronbox-Owner"))
    name = unquote(req.headers.get("X-Cronbox-Filename", "upload"), errors="strict")
    kind = req.mimetype or "application/octet-stream"
    sealed = st.seal(req.stream, filename=name, content_type=kind, limit=limit)
    return Received(sealed, owner, {}, name, kind)


def _receive_form(st: Storage, req: Request, limit: int, owner: str | None, owner_field: str) -> Received:
    """multipart/form-data with one file part (sealed as it streams) and text fields (the owner's among them)."""
    writers = []

    def stream_factory(total_content_length, content_type, filename, content_length=None):
        if writers:
            raise StorageError("send exactly one file per upload")
        writer = st.writer(filename=filename or "upload", content_type=content_type or "application/octet-stream",
                           limit=limit)
        writers.append(writer)
        return writer

    parser = FormDataParser(stream_factory=stream_factory, max_form_memory_size=MAX_FORM_FIELDS,
                            max_form_parts=MAX_FORM_PARTS, silent=False)
    try:
        _stream, form, files = parser.parse(req.stream, req.mimetype, req.content_length, req.mimetype_params)
        if not writers or not files:
            raise StorageError("no complete file part in the form")
        owner = owner or _owner(form.get(owner_field), owner_field)
        writer = writers[0]
        sealed = writer.finish()
    except BaseException:
        for writer in writers:
            writer.discard()
        raise
    return Received(sealed, owner, {name: form.get(name) for name in form}, writer.filename, writer.content_type)
