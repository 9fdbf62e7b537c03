"""Console forms get a small body limit before anything parses them (issue 24): an anonymous 20 MiB multipart
POST to the login (or any console form) is refused with 413 and writes nothing, over a real HTTP server, with
and without Content-Length; the host's own limit and routes are untouched."""
from __future__ import annotations

import socket
from typing import Iterator

import pytest
from flask import Flask, jsonify, request

from tests.web.test_host_uploads import BOUNDARY, part
from tests.web.test_storage_streaming import Server
from tests.write_watch import writes  # noqa: F401  (the fixture)
from cronbox import Cronbox
from cronbox.web.ops.guard import FORM_MAX

# How the request is read, checked and streamed: the server behind the rows changes nothing, so not
# PostgreSQL too (its storage rows are tested in test_storage_http, test_storage_hardening, test_host_uploads).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

MiB = 1024 * 1024
ZEROS = bytes(64 * 1024)


def host_app(runtime) -> tuple[Flask, list[int]]:
    """The host's app with the console mounted and a route of its own taking a large form; and the statuses
    the app answered (the client may see a reset instead: the server closes on a body it did not read)."""
    app = Flask("clinic")
    Cronbox().init_app(app, settings=runtime.settings).use_runtime(runtime)

    @app.post("/notes")
    def notes():
        return jsonify(size=len(request.form["note"])), 200

    app.extensions["cronbox"].storage.keyring()
    statuses: list[int] = []

    def application(environ, start_response):
        def start(status, headers, exc_info=None):
            statuses.append(int(status.split()[0]))
            return start_response(status, headers, exc_info)
        return app(environ, start)

    return app, application, statuses


def multipart_body(size: int):
    """A form with a file part of `size` zero bytes (a multiple of 64 KiB, or less than that), sent 64 KiB at a time."""
    head = part("csrf_token", b"anything") + (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n\r\n').encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    data = [ZEROS] * (size // len(ZEROS)) or [bytes(size)]
    return (lambda: iter([head, *data, tail])), len(head) + sum(map(len, data)) + len(tail)


def urlencoded_body(size: int):
    count = size // len(ZEROS)
    return (lambda: iter([b"csrf_token=x&note=", *([b"a" * len(ZEROS)] * count)])), 18 + count * len(ZEROS)


def send(port: int, path: str, content_type: str, chunks: Iterator[bytes], length: int | None) -> None:
    """POST the chunks: with a Content-Length, or chunked (none). A refusal may cut the upload short."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
    head += f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    try:
        sock.sendall(head.encode() + b"\r\n")
        for chunk in chunks:
            sock.sendall(chunk if length is not None else b"%x\r\n%s\r\n" % (len(chunk), chunk))
        if length is None:
            sock.sendall(b"0\r\n\r\n")
        sock.recv(65536)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()


MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"


@pytest.mark.parametrize("path", ["/ops/login", "/ops/outbox/retry", "/ops/logout"])
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize("kind", ["multipart", "urlencoded"])
def test_a_20_mib_console_form_is_413_and_writes_nothing(path, declared, kind, runtime, writes):
    app, application, statuses = host_app(runtime)
    chunks, length = multipart_body(20 * MiB) if kind == "multipart" else urlencoded_body(20 * MiB)
    content_type = MULTIPART if kind == "multipart" else "application/x-www-form-urlencoded"
    writes.clear()
    with Server(application) as server:
        send(server.port, path, content_type, chunks(), length if declared else None)
    assert statuses == [413]
    assert writes == []  # no temporary file (and nothing else)
    assert app.config["MAX_CONTENT_LENGTH"] is None  # the host's limit is the host's


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_small_multipart_console_form_is_415_without_a_temporary_file(declared, runtime, writes):
    app, application, statuses = host_app(runtime)
    chunks, length = multipart_body(1000)  # a file part: chunked, Werkzeug would give it a TemporaryFile
    writes.clear()
    with Server(application) as server:
        send(server.port, "/ops/login", MULTIPART, chunks(), length if declared else None)
    assert statuses == [415] and writes == []


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_forms_under_the_limit_still_reach_the_console_and_the_host_keeps_large_forms(declared, runtime):
    app, application, statuses = host_app(runtime)
    with Server(application) as server:
        small, small_length = urlencoded_body(FORM_MAX // 2)
        send(server.port, "/ops/login", "application/x-www-form-urlencoded", small(),
             small_length if declared else None)
        large, large_length = urlencoded_body(2 * MiB)
        send(server.port, "/notes", "application/x-www-form-urlencoded", large(),
             large_length if declared else None)
    assert statuses == [400, 200]  # the console's CSRF refusal (the form was read), the host's route as before
