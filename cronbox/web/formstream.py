"""A multipart/form-data body read part by part, in order, straight off the request's input stream.

Werkzeug's `request.form`/`request.files` parse the whole body at once and spill
a file part to a plaintext temporary file; its FormDataParser can stream a file
part into a writer, but hands over the text fields only at the end. An upload
needs more than that: the CSRF token or the owner sent in a field *before* the
file part must be checked before the first byte of the file is kept. So the
body is decoded here with Werkzeug's public sans-IO `MultipartDecoder`, fed 64
KiB at a time: `fields_before_file()` reads up to the file part's headers,
`file_data()` yields that part's bytes as they arrive, `rest()` reads what
follows. Nothing is ever written to disk here, and memory stays bounded by the
decoder's buffer limit and the number of parts.

A check that runs before the view (the console's guard, `sealed_upload_route`,
the `upload_operator` authorizer) starts the reading; the view's `seal_upload`
resumes it from the same place: the reader is kept in the request's WSGI
environ (`reader_for`), per request, under a key of cronbox's own.
"""
from __future__ import annotations

import re
from typing import Iterator

from flask import Request
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

CHUNK = 64 * 1024
# Werkzeug applies this both to each text field and to its parse buffer (fed CHUNK at a time).
MAX_FIELD = 256 * 1024
MAX_PARTS = 32
ENVIRON_KEY = "cronbox.form_reader"
_DASH_OR_SPACE = b"- \t\n\r\f\v"  # the bytes of the unended delimiter pattern's [-\s]


class FormError(ValueError):
    """The body is not the form it claims to be (malformed, cut short, a second file)."""


class FormReader:
    """One multipart body, read forward once: fields, then at most one file part, then the rest."""

    def __init__(self, stream, boundary: bytes, *, max_field: int = MAX_FIELD, max_parts: int = MAX_PARTS):
        self._stream = stream
        self._decoder = MultipartDecoder(boundary, max_form_memory_size=max_field, max_parts=max_parts)
        self._delimiter = b"--" + boundary
        # A delimiter line whose "--" boundary has come but not yet its end: then only "-" and
        # whitespace (the close's "--", padding, a line break still to come).
        self._unended_delimiter = re.compile(rb"(?:\A|\r\n|\r|\n)--" + re.escape(boundary) + rb"[-\s]*\Z")
        self._held = b""
        self._max_field = max_field
        self.fields: MultiDict[str, str] = MultiDict()
        self.file: File | None = None  # the file part's headers, once reached
        self._reached = False  # fields_before_file() has run
        self._file_read = False
        self._ended = False
        self._received = 0  # bytes of the body read so far

    def _event(self):
        """The next decoded event, reading more of the body when the decoder needs it.

        Werkzeug's decoder must never get a piece that ends inside a delimiter line: it looks for a
        partial delimiter only in the last len(boundary)+4 bytes, so in a piece ending in CRLF `--B-`
        (the close cut short, or followed by padding or an epilogue that puts a read's end there) it
        keeps the CR as the part's last byte. Such an unended line is held back (`_feedable`) and fed
        with the next read, or at the end of the body.
        """
        while True:
            event = self._decoder.next_event()
            if not isinstance(event, NeedData):
                return event
            data = self._stream.read(CHUNK)
            self._received += len(data)
            if not self._received:  # a chunked body something read before us (no position to tell it by) looks so
                raise FormError("the form is empty: no byte of the body arrived (if the route read the body "
                                "before seal_upload, read nothing of it)")
            if data:
                piece, self._held = self._feedable(self._held + data)
                self._decoder.receive_data(piece)
            elif self._held:
                self._decoder.receive_data(self._held)
                self._held = b""
            else:
                self._decoder.receive_data(None)  # the body ended (an error unless at the end)

    def _feedable(self, data: bytes) -> tuple[bytes, bytes]:
        """`data` split into what the decoder may have now and the start of a delimiter line that waits
        for more: a line break followed by a prefix of "--" boundary, or by all of it and only "-" and
        whitespace since. So a fed piece never ends in a line break or within a delimiter line."""
        hold = len(data)
        # Such a line's "-"/whitespace end lies in the trailing run of those bytes: searching only from
        # just before that run keeps the search linear whatever the body (a boundary of dashes too).
        run = len(data.rstrip(_DASH_OR_SPACE))
        match = self._unended_delimiter.search(data, max(0, run - len(self._delimiter) - 2))
        if match is not None:
            hold = match.start()
        for start in range(max(0, len(data) - len(self._delimiter) - 2), hold):
            if data[start] in b"\r\n":
                after = data[start + 2:] if data[start:start + 2] == b"\r\n" else data[start + 1:]
                if self._delimiter.startswith(after):
                    hold = start
                    break
        if len(data) - hold > self._max_field:
            raise FormError("the form is malformed")  # a delimiter line that never ends
        return data[:hold], data[hold:]

    def _field_value(self, part: Field) -> str:
        chunks, size = [], 0
        while True:
            event = self._event()
            if not isinstance(event, Data):
                raise FormError("the form is malformed")
            size += len(event.data)
            if size > self._max_field:
                raise RequestEntityTooLarge(f"a form field is larger than {self._max_field} bytes")
            chunks.append(event.data)
            if not event.more_data:
                return b"".join(chunks).decode("utf-8", "replace")

    def _read_fields(self) -> File | None:
        """Text fields into `fields` up to the next file part (its headers returned) or the end (None)."""
        while True:
            event = self._event()
            if isinstance(event, Field):
                self.fields.add(event.name, self._field_value(event))
            elif isinstance(event, File):
                return event
            elif isinstance(event, Epilogue):
                self._ended = True
                return None
            # else the preamble: nothing to keep

    def fields_before_file(self) -> MultiDict[str, str]:
        """The text fields sent before the first file part (all of them when there is none)."""
        if not self._reached:
            self._reached = True
            self.file = self._read_fields()
        return self.fields

    def file_data(self) -> Iterator[bytes]:
        """The file part's bytes as they arrive (nothing when the form has no file part)."""
        self.fields_before_file()
        if self.file is None or self._file_read:
            return
        self._file_read = True
        while True:
            event = self._event()
            if not isinstance(event, Data):
                raise FormError("the form is malformed")
            if event.data:
                yield event.data
            if not event.more_data:
                return

    def rest(self) -> MultiDict[str, str]:
        """Read the fields after the file part to the end of the body: all fields; FormError for a second file."""
        for _ in self.file_data():
            raise FormError("read the file part before the rest of the form")
        if not self._ended and self._read_fields() is not None:
            raise FormError("send exactly one file per upload")
        return self.fields


def boundary_of(req: Request) -> bytes:
    boundary = req.mimetype_params.get("boundary", "")
    if not boundary:
        raise FormError("the multipart form has no boundary")
    try:
        return boundary.encode("ascii")
    except UnicodeEncodeError:
        raise FormError("the multipart boundary must be ASCII") from None


def started_reader(req: Request) -> FormReader | None:
    """The reader a check before the view already started for this request, if any."""
    return req.environ.get(ENVIRON_KEY)


def reader_for(req: Request, *, max_field: int = MAX_FIELD, max_parts: int = MAX_PARTS) -> FormReader:
    """This request's form reader: the one already started, else a new one on `req.stream` (kept for later)."""
    reader = started_reader(req)
    if reader is None:
        reader = FormReader(req.stream, boundary_of(req), max_field=max_field, max_parts=max_parts)
        req.environ[ENVIRON_KEY] = reader
    return reader


def fields_before_file(req: Request) -> MultiDict[str, str]:
    """The text fields before the file part of this request's multipart form (none when the body is no
    multipart form); FormError for a malformed form."""
    if req.mimetype != "multipart/form-data":
        return MultiDict()
    return reader_for(req).fields_before_file()


def field_before_file(req: Request, name: str) -> str | None:
    """The value of text field `name` when it comes before the file part of this request's multipart
    form (None when it does not, or the body is no multipart form); FormError for a malformed form."""
    return fields_before_file(req).get(name)
