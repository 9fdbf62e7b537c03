"""cronbox.web.formstream: a multipart body read forward once, fields before the file part first, whatever sizes
the input stream hands over (a chunked body arrives in arbitrary pieces)."""
from __future__ import annotations

import io
import os
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from werkzeug.exceptions import RequestEntityTooLarge

from cronbox.web.formstream import FormError, FormReader
from tests.conftest import thorough
from werkzeug.wrappers import Request

BOUNDARY = "----formstream-boundary"


def part(name: str, value: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"


def form(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


class Trickle(io.RawIOBase):
    """At most `step` bytes per read, and how many bytes were read so far."""

    def __init__(self, data: bytes, step: int):
        self.data, self.step, self.position = data, step, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        take = self.data[self.position:self.position + min(self.step, size if size >= 0 else self.step)]
        self.position += len(take)
        return take


def reader(body: bytes, step: int = 1 << 20, **limits) -> tuple[FormReader, Trickle]:
    stream = Trickle(body, step)
    return FormReader(stream, BOUNDARY.encode(), **limits), stream


@pytest.mark.parametrize("step", [1, 7, 4096, 1 << 20])
def test_fields_before_the_file_are_known_before_its_bytes_are_read(step):
    data = os.urandom(100_000)  # more than one 64 KiB read, so the position below says what it should
    body = form(part("csrf_token", b"tok"), part("owner", b"patient:1"), part("scan", data, "s.pdf"),
                part("visit", b"42"))
    forms, stream = reader(body, step)
    assert forms.fields_before_file().to_dict() == {"csrf_token": "tok", "owner": "patient:1"}
    assert forms.file.filename == "s.pdf"
    assert stream.position < 200 + 64 * 1024  # the file part's bytes are still to come (one chunk at most)
    assert b"".join(forms.file_data()) == data
    assert forms.rest().to_dict() == {"csrf_token": "tok", "owner": "patient:1", "visit": "42"}


def test_a_field_after_the_file_is_not_among_the_fields_before_it():
    forms, _ = reader(form(part("scan", b"%PDF", "s.pdf"), part("csrf_token", b"tok")))
    assert forms.fields_before_file().to_dict() == {} and forms.file is not None


@pytest.mark.parametrize("body,error", [
    (form(part("a", b"%PDF", "a.pdf"), part("b", b"%PDF", "b.pdf")), FormError),  # two files
    (form(part("a", b"%PDF", "a.pdf"))[:-10], ValueError),  # cut short
    (b"no boundary anywhere", ValueError),
    (form(part("note", b"x" * 5000), part("a", b"%PDF", "a.pdf")), RequestEntityTooLarge),  # a field over the max
])
def test_a_form_that_is_not_one_file_and_fields_is_an_error(body, error):
    forms, _ = reader(body, 1000, max_field=4096)
    with pytest.raises(error):
        forms.fields_before_file()
        for _ in forms.file_data():
            pass
        forms.rest()


def test_a_form_without_a_file_part_ends_with_its_fields():
    forms, _ = reader(form(part("owner", b"patient:1")))
    assert forms.fields_before_file().to_dict() == {"owner": "patient:1"} and forms.file is None
    assert list(forms.file_data()) == [] and forms.rest().to_dict() == {"owner": "patient:1"}


@pytest.mark.parametrize("past", range(0, 24))
def test_a_body_ending_just_past_a_64_kib_read_keeps_its_file_and_fields_intact(past):
    """Werkzeug's decoder, fed a buffer that ends inside the closing delimiter, kept its `\\r` as the
    part's last byte (its own parser does so for a body 3 bytes past a multiple of 64 KiB)."""
    empty = len(form(part("scan", b"", "s.pdf")))
    data = os.urandom(2 * 64 * 1024 + past - empty)
    forms = FormReader(io.BytesIO(form(part("scan", data, "s.pdf"))), BOUNDARY.encode())
    forms.fields_before_file()
    assert b"".join(forms.file_data()) == data
    value = "4" * (64 * 1024 + past - len(form(part("visit", b""))))
    fields = FormReader(io.BytesIO(form(part("visit", value.encode()))), BOUNDARY.encode())
    assert fields.rest()["visit"] == value


def werkzeug_parse(body: bytes, boundary: str) -> tuple[dict, dict]:
    """Werkzeug's own parse of the whole body (one read: it is smaller than its 64 KiB chunk)."""
    environ = {"REQUEST_METHOD": "POST", "CONTENT_TYPE": f'multipart/form-data; boundary="{boundary}"',
               "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
    request = Request(environ)
    return ({key: request.form.getlist(key) for key in request.form},
            {key: [f.read() for f in request.files.getlist(key)] for key in request.files})


def read_all(body: bytes, boundary: str, step: int) -> tuple[dict, dict]:
    forms = FormReader(Trickle(body, step), boundary.encode())
    forms.fields_before_file()
    name = forms.file.name if forms.file is not None else None
    data = b"".join(forms.file_data())
    fields = forms.rest()
    return {key: fields.getlist(key) for key in fields}, ({name: [data]} if name is not None else {})


def closed(boundary: str, parts: bytes, padding: bytes, epilogue: bytes) -> bytes:
    return parts + f"--{boundary}--".encode() + padding + b"\r\n" + epilogue


@pytest.mark.parametrize("step", [1, 2, 3, 5, 64 * 1024])
@pytest.mark.parametrize("extra", range(len(BOUNDARY) + 1, len(BOUNDARY) + 10))
@pytest.mark.parametrize("where", ["epilogue", "padding", "both"])
def test_an_epilogue_or_padding_after_the_close_adds_nothing_to_the_file_or_a_field(where, extra, step):
    """A read that ended just after CRLF `--B-` made Werkzeug's decoder keep the CR as the last byte
    of the part before: an epilogue or padding of len(boundary)+5 bytes put the end of a read there."""
    epilogue = b"e" * extra if where != "padding" else b""
    padding = b" " * (extra if where == "padding" else 2)
    body = closed(BOUNDARY, part("csrf_token", b"tok") + part("scan", b"DATA", "s.pdf") + part("owner", b"alice"),
                  padding, epilogue)
    assert read_all(body, BOUNDARY, step) == werkzeug_parse(body, BOUNDARY) == (
        {"csrf_token": ["tok"], "owner": ["alice"]}, {"scan": [b"DATA"]})


content = st.binary(max_size=300) | st.lists(st.sampled_from([b"\r", b"\n", b"-", b" ", b"a", b"\x00"]),
                                            max_size=60).map(b"".join)


@settings(max_examples=thorough(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(boundary=st.text("abcXYZ019'()+_,-./:=?", min_size=1, max_size=70),
       before=st.lists(content, max_size=2), data=content, after=st.lists(content, max_size=2),
       padding=st.sampled_from([b"", b" ", b"\t  "]) | st.text(" \t", max_size=80).map(str.encode),
       epilogue=content, step=st.integers(1, 200) | st.just(64 * 1024))
def test_every_field_and_the_file_are_what_werkzeug_parses_from_the_same_body(boundary, before, data, after,
                                                                             padding, epilogue, step):
    def field(name, value):
        return (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n").encode() + value + b"\r\n"

    values = before + [data] + after
    assume(not any(boundary.encode() in value or value.endswith(b"\r") for value in values + [epilogue]))
    assume(all(value == value.decode("utf-8", "replace").encode() for value in before + after))
    body = closed(boundary, b"".join(field(f"b{i}", v) for i, v in enumerate(before))
                  + field("scan", data).replace(b'name="scan"', b'name="scan"; filename="s.bin"')
                  + b"".join(field(f"a{i}", v) for i, v in enumerate(after)), padding, epilogue)
    assert read_all(body, boundary, step) == werkzeug_parse(body, boundary)


@pytest.mark.parametrize("boundary,unit", [("-", b"\n---"), ("--", b"\r\n----\t"), ("a", b"\n--a ")])
def test_looking_for_an_unended_delimiter_line_stays_linear_whatever_the_body(boundary, unit):
    """A boundary of dashes and a file of line breaks and dashes: a search from every line break to the
    end of each read took seconds per 64 KiB; the search starts at the trailing run of "-"/whitespace."""
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\n".encode()
            + unit * 40_000 + b"x" + f"\r\n--{boundary}--\r\n".encode())
    forms = FormReader(io.BytesIO(body), boundary.encode())
    started = time.monotonic()
    try:  # whatever the decoder makes of such a body, what matters here is how soon
        forms.fields_before_file()
        for _ in forms.file_data():
            pass
        forms.rest()
    except (ValueError, RequestEntityTooLarge):
        pass
    # Linear: hundredths of a second. The quadratic search took about a minute (56 s and 156 s for the
    # first two bodies, measured beside a CPU hog): the bound tells apart only that, however loaded.
    assert time.monotonic() - started < 20
