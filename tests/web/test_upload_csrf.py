"""A host's sealed-upload route under Flask-WTF's CSRFProtect (issue 24): `@sealed_upload_route(csrf=csrf)`
checks the host's token from a header or a field before the file part, with no temporary file; a body
something else read first is refused loudly (BodyAlreadyRead) before anything is written. On every backend."""
from __future__ import annotations

import io
import logging
import os
from pathlib import Path

import pytest
from flask import Flask, jsonify, request
from flask_wtf.csrf import CSRFProtect, generate_csrf
from werkzeug.test import EnvironBuilder, run_wsgi_app

from tests.storage_helpers import files_under
from tests.web.test_host_uploads import FORM, form, part, rows
from tests.write_watch import writes  # noqa: F401  (the fixture)
from cronbox import Cronbox, seal_upload, sealed_upload_route

# How the request is read, checked and streamed: the server behind the rows changes nothing, so not
# PostgreSQL too (its storage rows are tested in test_storage_http, test_storage_hardening, test_host_uploads).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

MiB = 1024 * 1024
SCAN = os.urandom(MiB)  # over Werkzeug's 500 KiB in-memory part: a spool file if anything parses it


def clinic(runtime, *, wtf: bool = True) -> Flask:
    """A host app with Flask-WTF's CSRFProtect (or none), a sealed-upload route, a plain form route, and
    routes that read the body before seal_upload (the mistakes BodyAlreadyRead catches)."""
    app = Flask("clinic")
    app.secret_key = "host-secret"
    csrf = CSRFProtect(app) if wtf else None
    Cronbox().init_app(app, settings=runtime.settings).use_runtime(runtime)

    @app.get("/token")
    def token():
        return generate_csrf() if wtf else ""

    @app.post("/scans")
    @sealed_upload_route(csrf=csrf)
    def scans():
        with runtime.sessions.begin() as session:
            upload = seal_upload(session=session, owner="patient:7")
        return jsonify(id=upload.file_id, size=upload.size, fields=upload.fields), 201

    @app.post("/bare-scans")
    @sealed_upload_route
    def bare_scans():
        with runtime.sessions.begin() as session:
            upload = seal_upload(session=session, owner="patient:7")
        return jsonify(id=upload.file_id, size=upload.size), 201

    @app.post("/undecorated")
    def undecorated():  # CSRFProtect parses the form before this view runs
        with runtime.sessions.begin() as session:
            return jsonify(id=seal_upload(session=session, owner="patient:7").file_id), 201

    readers = {"form": lambda: request.form, "files": lambda: request.files, "data": lambda: request.data,
               "get_data": lambda: request.get_data(), "json": lambda: request.get_json(silent=True),
               "stream": lambda: request.stream.read(10)}
    for name, read in readers.items():
        def reads_first(read=read):
            read()
            with runtime.sessions.begin() as session:
                return jsonify(id=seal_upload(session=session, owner="patient:7").file_id), 201
        app.add_url_rule(f"/reads-{name}-first", f"reads_{name}_first", reads_first, methods=["POST"])
        if csrf is not None:
            csrf.exempt(f"{reads_first.__module__}.reads_first")

    @app.post("/notes")
    def notes():  # the host's own form: CSRFProtect as ever
        return jsonify(note=request.form.get("note")), 200

    app.extensions["cronbox"].storage.keyring()  # master keys made before the write watcher listens
    return app


def fresh(runtime, **kwargs):
    app = clinic(runtime, **kwargs)
    client = app.test_client()
    return app, client, client.get("/token").get_data(as_text=True)


def multipart(client, url: str, body: bytes, **headers):
    return client.post(url, data=body, content_type=FORM, headers=headers)


def outside(writes, sealed_dir: Path) -> list[str]:
    return [p for p in writes if not Path(p).resolve().is_relative_to(sealed_dir.resolve())]


def test_the_token_before_the_file_or_in_a_header_seals_with_no_temporary_file(runtime, writes):
    sealed_dir = runtime.settings.sealed_dir
    app, client, token = fresh(runtime)
    writes.clear()
    in_field = multipart(client, "/scans", form(part("csrf_token", token.encode()), part("visit", b"42"),
                                                part("scan", SCAN, filename="scan.pdf")))
    assert in_field.status_code == 201, in_field.data
    assert in_field.get_json()["size"] == len(SCAN)
    in_header = multipart(client, "/scans", form(part("scan", SCAN, filename="scan.pdf")), **{"X-CSRFToken": token})
    assert in_header.status_code == 201, in_header.data
    raw = client.post("/scans", data=SCAN, content_type="application/pdf", headers={"X-CSRF-Token": token})
    assert raw.status_code == 201, raw.data
    assert writes and outside(writes, sealed_dir) == []
    assert rows(runtime) == (3, 3)


def chunked(app, url: str, body: bytes, content_type: str, cookie: str, **headers) -> int:
    """The status for a chunked body (no Content-Length), the way a server hands it over."""
    environ = EnvironBuilder(path=url, method="POST", input_stream=io.BytesIO(body), content_type=content_type,
                             headers={"Cookie": cookie, **headers}).get_environ()
    environ.pop("CONTENT_LENGTH", None)
    environ["wsgi.input_terminated"] = True
    _body, status, _headers = run_wsgi_app(app, environ, buffered=True)
    return int(status.split()[0])


REFUSED = {
    "no token": lambda token: (form(part("scan", SCAN, filename="scan.pdf")), FORM, {}),
    "a wrong token": lambda token: (form(part("csrf_token", b"forged"), part("scan", SCAN, filename="s.pdf")), FORM,
                                    {}),
    "the token after the file": lambda token: (form(part("scan", SCAN, filename="s.pdf"),
                                                    part("csrf_token", token.encode())), FORM, {}),
    "a wrong header": lambda token: (form(part("scan", SCAN, filename="s.pdf")), FORM, {"X-CSRFToken": token[:-3]}),
    "a raw body without the header": lambda token: (SCAN, "application/pdf", {}),
    "a raw body with a wrong header": lambda token: (SCAN, "application/pdf", {"X-CSRF-Token": "forged"}),
    "a malformed form": lambda token: (b"not a form at all", FORM, {}),
}


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_missing_wrong_or_late_token_is_refused_with_nothing_written(case, declared, runtime, writes):
    app, client, token = fresh(runtime)
    body, content_type, headers = REFUSED[case](token)
    writes.clear()
    if declared:
        status = client.post("/scans", data=body, content_type=content_type, headers=headers).status_code
    else:
        cookie = f"session={client.get_cookie('session').value}"
        status = chunked(app, "/scans", body, content_type, cookie, **headers)
    assert status == 400, case
    assert writes == []  # no temporary file, no sealed file
    assert list(files_under(runtime.settings.sealed_dir)) == [] and rows(runtime) == (0, 0)


def test_the_hosts_other_routes_keep_their_csrf_protection(runtime):
    app, client, token = fresh(runtime)
    assert client.post("/notes", data={"note": "hi"}).status_code == 400
    assert client.post("/notes", data={"note": "hi", "csrf_token": "forged"}).status_code == 400
    assert client.post("/notes", data={"note": "hi", "csrf_token": token}).get_json() == {"note": "hi"}
    # The exemption is the decorated route's alone: the undecorated upload route is still checked.
    assert multipart(client, "/undecorated", form(part("scan", b"%PDF", filename="s.pdf"))).status_code == 400


def test_an_undecorated_route_under_csrfprotect_is_refused_loudly(runtime, caplog):
    app, client, token = fresh(runtime)
    app.testing = False  # a 500, as in production
    with caplog.at_level(logging.ERROR, logger="cronbox"):
        answer = multipart(client, "/undecorated", form(part("csrf_token", token.encode()),
                                                         part("scan", SCAN, filename="s.pdf")))
    assert answer.status_code == 500
    assert "the request body was already read" in caplog.text and "sealed_upload_route" in caplog.text
    assert list(files_under(runtime.settings.sealed_dir)) == [] and rows(runtime) == (0, 0)


@pytest.mark.parametrize("reader", ["form", "files", "data", "get_data", "json", "stream"])
@pytest.mark.parametrize("body,content_type", [
    (form(part("scan", SCAN, filename="s.pdf")), FORM), (SCAN, "application/pdf"),
    (b'{"scan": "%PDF"}', "application/json")], ids=["multipart", "raw", "json"])
def test_a_body_read_before_seal_upload_is_refused_before_anything_is_written(reader, body, content_type,
                                                                               runtime, writes):
    app, client, _ = fresh(runtime, wtf=False)
    writes.clear()
    answer = client.post(f"/reads-{reader}-first", data=body, content_type=content_type,
                         headers={"X-Cronbox-Filename": "s.pdf"})
    consumed = (reader in ("data", "get_data", "stream") or (reader in ("form", "files") and content_type == FORM)
                or (reader == "json" and content_type == "application/json"))
    if not consumed:  # request.form on a body that is no form, get_json on one that is no JSON: left unread
        assert answer.status_code == 201 and rows(runtime) == (1, 1)
        return
    assert answer.status_code == 500
    assert [p for p in writes if Path(p).resolve().is_relative_to(runtime.settings.sealed_dir.resolve())] == []
    assert list(files_under(runtime.settings.sealed_dir)) == [] and rows(runtime) == (0, 0)


def test_the_decorator_works_without_flask_wtf(runtime, writes):
    app, client, _ = fresh(runtime, wtf=False)
    writes.clear()
    for url in ["/scans", "/bare-scans"]:
        done = multipart(client, url, form(part("scan", SCAN, filename="scan.pdf")))
        assert done.status_code == 201, done.data
    assert outside(writes, runtime.settings.sealed_dir) == [] and rows(runtime) == (2, 2)
