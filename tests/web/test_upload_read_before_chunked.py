"""A body the host read before seal_upload, over a real HTTP server (Werkzeug's, chunked or with a
Content-Length, with and without MAX_CONTENT_LENGTH), is never sealed (issue 24 follow-up).

With a Content-Length, or chunked under a MAX_CONTENT_LENGTH, Werkzeug's stream is a LimitedStream
whose position shows the read: BodyAlreadyRead, a 500. Chunked with no MAX_CONTENT_LENGTH, seal_upload
gives the request a limit of its own before it opens the stream, so the stream is a LimitedStream too;
one the host opened first is not, and is refused the same way (a part read would not show). An empty
upload is refused with a 400 (raw or multipart). Never an empty or partial sealed file, no row, no file written. On every backend.
"""
from __future__ import annotations

import http.client
import os
from pathlib import Path

import pytest
from flask import Flask, jsonify, request

from tests.storage_helpers import files_under
from tests.web.test_host_uploads import FORM, form, part, rows
from tests.web.test_storage_streaming import Server
from tests.write_watch import writes  # noqa: F401  (the fixture)
from cronbox import Cronbox, seal_upload, sealed_upload_route

# How the request is read, checked and streamed: the server behind the rows changes nothing, so not
# PostgreSQL too (its storage rows are tested in test_storage_http, test_storage_hardening, test_host_uploads).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

SCAN = os.urandom(200 * 1024)  # under Werkzeug's 500 KiB in-memory part: its own parse writes nothing either
READERS = {"part": lambda: request.stream.read(10), "get_data": lambda: request.get_data(), "data": lambda: request.data, "form": lambda: request.form,
           "files": lambda: request.files, "stream": lambda: request.stream.read()}
BODIES = {"raw": (SCAN, "application/pdf"), "multipart": (form(part("scan", SCAN, filename="s.pdf")), FORM)}


def clinic(runtime, max_content_length: int | None) -> Flask:
    """A host app whose before_request reads the body when told to (X-Read: the way), and a sealed-upload route."""
    app = Flask("clinic")
    app.config["MAX_CONTENT_LENGTH"] = max_content_length
    Cronbox().init_app(app, settings=runtime.settings).use_runtime(runtime)

    @app.before_request
    def host_reads_the_body():
        way = request.headers.get("X-Read")
        if way:
            READERS[way]()

    @app.post("/scans")
    @sealed_upload_route
    def scans():
        with runtime.sessions.begin() as session:
            upload = seal_upload(session=session, owner="patient:7")
        return jsonify(size=upload.size), 201

    app.extensions["cronbox"].storage.keyring()  # master keys made before the write watcher listens
    return app


def post(server: Server, body: bytes, content_type: str, *, chunked: bool, **headers) -> tuple[int, str]:
    connection = server.connection()
    try:
        if chunked:  # http.client sends an iterable body with Transfer-Encoding: chunked
            connection.request("POST", "/scans", body=iter([body[i:i + 65536] for i in range(0, len(body), 65536)]),
                               headers={"Content-Type": content_type, **headers}, encode_chunked=True)
        else:
            connection.request("POST", "/scans", body=body, headers={"Content-Type": content_type, **headers})
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def nothing_kept(runtime, writes) -> None:
    logs = runtime.settings.logs_dir.resolve()
    assert [p for p in writes if not Path(p).resolve().is_relative_to(logs)] == []  # no temp file, no sealed file
    assert list(files_under(runtime.settings.sealed_dir)) == [] and rows(runtime) == (0, 0)


@pytest.mark.parametrize("limit", [None, 16 * 1024 * 1024], ids=["no-max", "max"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("kind", sorted(BODIES))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_body_read_by_the_host_first_is_never_sealed(reader, kind, chunked, limit, runtime, writes):
    body, content_type = BODIES[kind]
    with Server(clinic(runtime, limit)) as server:
        writes.clear()
        status, text = post(server, body, content_type, chunked=chunked, **{"X-Read": reader})
    if reader in ("form", "files") and kind == "raw" and not (chunked and limit is None):
        # request.form of a body that is no form leaves it unread (chunked with no MAX_CONTENT_LENGTH it
        # still opens the server's stream, which shows no position: refused below, as unprovable)
        assert status == 201 and f'"size":{len(SCAN)}' in text.replace(" ", "")
        assert rows(runtime) == (1, 1)
        return
    # A LimitedStream whose position shows the read, or (chunked, no MAX_CONTENT_LENGTH) a stream the
    # host opened before seal_upload could give the request a limit of its own: BodyAlreadyRead.
    assert status == 500, (status, text)
    nothing_kept(runtime, writes)


@pytest.mark.parametrize("limit", [None, 16 * 1024 * 1024], ids=["no-max", "max"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("kind", sorted(BODIES))
def test_an_unread_body_is_sealed_whole(kind, chunked, limit, runtime):
    body, content_type = BODIES[kind]
    with Server(clinic(runtime, limit)) as server:
        status, text = post(server, body, content_type, chunked=chunked)
    assert status == 201 and f'"size":{len(SCAN)}' in text.replace(" ", ""), (status, text)
    assert rows(runtime) == (1, 1)


@pytest.mark.parametrize("limit", [None, 16 * 1024 * 1024], ids=["no-max", "max"])
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("kind", ["raw", "multipart"])
def test_an_empty_upload_is_refused_with_a_400(kind, chunked, limit, runtime, writes):
    """An empty file holds nothing worth keeping, and is what a chunked body read earlier looks like."""
    with Server(clinic(runtime, limit)) as server:
        writes.clear()
        status, text = post(server, b"", "application/pdf" if kind == "raw" else FORM, chunked=chunked)
    assert status == 400 and "empty" in text, (status, text)
    nothing_kept(runtime, writes)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("kind", ["raw", "multipart"])
def test_post_files_refuses_an_empty_upload_too(kind, chunked, runtime, env, writes):
    from app import create_app
    from cronbox.outbox.core.settings import load_settings

    app = create_app(load_settings(environ={**env, "CRONBOX_UPLOAD_TOKEN": "up-token"}))
    app.extensions["cronbox"].use_runtime(runtime)
    app.extensions["cronbox"].storage.keyring()
    with Server(app) as server:
        writes.clear()
        connection = server.connection()
        headers = {"Authorization": "Bearer up-token", "X-Cronbox-Owner": "patient:7",
                   "Content-Type": "application/pdf" if kind == "raw" else FORM}
        connection.request("POST", "/files", body=iter([]) if chunked else b"", headers=headers,
                           encode_chunked=chunked)
        response = connection.getresponse()
        status, text = response.status, response.read().decode()
        connection.close()
    assert status == 400 and "empty" in text, (status, text)
    nothing_kept(runtime, writes)
