"""cronbox.web.uploads.seal_upload in a host's own Flask route: sealed while it streams, nothing else written, refusals
leave nothing behind. On every backend."""
from __future__ import annotations

import io
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from flask import Flask, jsonify, request
from sqlalchemy import func, select
from werkzeug.test import EnvironBuilder, run_wsgi_app

from cronbox import storage
from cronbox.storage.models import AuditEntry, SealedFile
from tests.write_watch import writes  # noqa: F401  (the fixture)
from tests.storage_helpers import files_under
from cronbox import Cronbox
from cronbox.web.uploads import UploadRefused, seal_upload

# The host app's login and form handling: the server behind the rows changes nothing, so not PostgreSQL
# too (.ci/run's 30 minutes; storage rows are tested on it by test_storage_http and test_storage_hardening).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

MiB = 1024 * 1024
BOUNDARY = "----cronbox-test-boundary"


# --- a host app --------------------------------------------------------------------------------

def host_app(runtime) -> Flask:
    """The user's own Flask app with cronbox registered on it, and two routes of its own."""
    app = Flask("clinic")
    app.testing = True
    Cronbox().init_app(app, settings=runtime.settings).use_runtime(runtime)

    @app.post("/scans")
    def scans():
        with runtime.sessions.begin() as session:  # the host's transaction: the row commits with it
            upload = seal_upload(session=session)
        return jsonify(id=upload.file_id, size=upload.size, fields=upload.fields, filename=upload.filename,
                       content_type=upload.content_type), 201

    @app.post("/patients/<int:patient>/scans")
    def patient_scans(patient: int):
        try:
            with runtime.sessions.begin() as session:
                upload = seal_upload(session=session, owner=f"patient:{patient}")
        except UploadRefused as refused:  # a host may answer its own way
            return jsonify(problem=refused.message), refused.status
        return jsonify(id=upload.file_id, fields=upload.fields), 201

    @app.post("/naive")
    def naive():  # what issue 10 found: request.files spools the upload to a plaintext temporary file
        with runtime.sessions.begin() as session:
            file_id = storage.put(session, request.files["scan"].stream, filename="scan.pdf",
                                  content_type="application/pdf", owner=request.form["owner"])
        return jsonify(id=file_id), 201

    return app


@pytest.fixture
def host(runtime):
    app = host_app(runtime)
    app.extensions["cronbox"].storage.keyring()  # master keys are made on first use: before the hook listens
    yield app
    storage.configure(runtime.settings, runtime.sessions)


@pytest.fixture
def sealed_dir(runtime) -> Path:
    return runtime.settings.sealed_dir


def part(name: str, value: bytes, filename: str | None = None, content_type: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    head = f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"\r\n" + value + b"\r\n"


def form(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def post(client, url: str, body: bytes, content_type: str = f"multipart/form-data; boundary={BOUNDARY}",
         **extra):
    return client.post(url, data=body, content_type=content_type, **extra)


def call(app, body: bytes, content_type: str, *, declared: bool, terminated: bool = True) -> int:
    """The app's status for this exact environ: with a Content-Length, or without (chunked when `terminated`).
    The test client would rebuild the environ, Content-Length included."""
    environ = EnvironBuilder(path="/scans", method="POST", input_stream=io.BytesIO(body),
                             content_type=content_type).get_environ()
    environ["CONTENT_LENGTH"] = str(len(body))
    if not declared:
        environ.pop("CONTENT_LENGTH")
        if terminated:
            environ["wsgi.input_terminated"] = True
    _body, status, _headers = run_wsgi_app(app, environ, buffered=True)
    return int(status.split()[0])


def rows(runtime) -> tuple[int, int]:
    with runtime.sessions() as session:
        return (session.scalar(select(func.count()).select_from(SealedFile)),
                session.scalar(select(func.count()).select_from(AuditEntry).where(AuditEntry.action == "put")))


def test_a_5_mib_form_is_sealed_while_it_streams_and_nothing_else_is_written(host, runtime, sealed_dir, writes):
    data = os.urandom(5 * MiB)
    body = form(part("owner", b"patient:1842"), part("visit", "42 é".encode()),
                part("scan", data, filename="scan.pdf", content_type="application/pdf"))
    response = post(host.test_client(), "/scans", body)

    assert response.status_code == 201, response.data
    answer = response.get_json()
    assert answer["size"] == len(data) and answer["filename"] == "scan.pdf"
    assert answer["content_type"] == "application/pdf"
    assert answer["fields"] == {"owner": "patient:1842", "visit": "42 é"}
    # Allowed: the sealed file's temporary and final name under <instance>/private/ (SealingWriter) and
    # nothing else. SQLite's database, -wal and -journal files are written by the sqlite3 C library,
    # which raises no Python audit event; MariaDB writes nothing here.
    assert writes, "the audit hook saw no write at all: it is not listening"
    outside = [path for path in writes if not Path(path).resolve().is_relative_to(sealed_dir.resolve())]
    assert outside == []
    assert {Path(p).name.split(".")[0] for p in writes} == {answer["id"]}
    with runtime.sessions() as session, host.app_context():  # the host app's store, as in its own code
        opened = storage.open_file(session, answer["id"])
        try:
            assert b"".join(bytes(chunk) for chunk in opened.iter_range(0, opened.size)) == data
        finally:
            opened.close()
        assert session.get(SealedFile, answer["id"]).owner == "patient:1842"


def test_request_files_in_a_host_route_writes_a_plaintext_temporary_file(host, sealed_dir, writes):
    """The hook above would catch the problem the helper solves: Werkzeug's spool file for a large part."""
    body = form(part("owner", b"patient:1"), part("scan", os.urandom(MiB), filename="scan.pdf"))
    assert post(host.test_client(), "/naive", body).status_code == 201
    assert [p for p in writes if not Path(p).resolve().is_relative_to(sealed_dir.resolve())]


def test_the_owner_may_come_from_the_route_and_a_raw_body_works_too(host, runtime):
    client = host.test_client()
    response = post(client, "/patients/7/scans", form(part("note", b"left knee"),
                                                      part("scan", b"%PDF-1.7", filename="knee.pdf")))
    assert response.status_code == 201 and response.get_json()["fields"] == {"note": "left knee"}
    raw = post(client, "/patients/7/scans", b"%PDF raw", content_type="application/pdf",
               headers={"X-Cronbox-Filename": "raw.pdf"})
    assert raw.status_code == 201 and raw.get_json()["fields"] == {}
    with runtime.sessions() as session:
        assert {r.owner for r in session.scalars(select(SealedFile))} == {"patient:7"}


FILE = part("scan", b"x" * 5000, filename="scan.pdf")
OWNER = part("owner", b"patient:1842")
FORM = f"multipart/form-data; boundary={BOUNDARY}"
BAD = {
    "two file parts": (form(OWNER, FILE, part("other", b"y", filename="b.pdf")), FORM, 400),
    "no owner": (form(FILE), FORM, 400),
    "an empty owner": (form(part("owner", b""), FILE), FORM, 400),
    "an owner with control characters": (form(part("owner", b"patient:1\x1b[2J"), FILE), FORM, 400),
    "no file part": (form(OWNER, part("scan", b"not a file")), FORM, 400),
    "over CRONBOX_UPLOAD_MAX": (form(OWNER, part("scan", b"x" * 20000, filename="big.pdf")), FORM, 413),
    "a truncated body": (form(OWNER, FILE)[:3000], FORM, 400),
    "a body cut before the closing boundary": (OWNER + FILE, FORM, 400),
    "no boundary": (form(OWNER, FILE), "multipart/form-data", 400),
    "another boundary than the body's": (form(OWNER, FILE), "multipart/form-data; boundary=elsewhere", 400),
    "a urlencoded form": (b"owner=patient%3A1&scan=abc", "application/x-www-form-urlencoded", 400),
    "multipart but not a form": (form(OWNER, FILE), f"multipart/mixed; boundary={BOUNDARY}", 400),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_refused_upload_gets_its_status_and_leaves_no_file_or_row(case, declared, host, runtime, sealed_dir):
    body, content_type, status = BAD[case]
    st = host.extensions["cronbox"].storage
    st.settings = replace(st.settings, upload_max=10000)  # CRONBOX_UPLOAD_MAX, for this app's Storage only
    assert call(host, body, content_type, declared=declared) == status, case
    assert list(files_under(sealed_dir)) == []
    assert rows(runtime) == (0, 0)


def test_an_undeclared_length_without_chunking_is_refused(host, runtime, sealed_dir):
    assert call(host, form(OWNER, FILE), FORM, declared=False, terminated=False) == 411
    assert list(files_under(sealed_dir)) == [] and rows(runtime) == (0, 0)


def test_a_host_can_answer_a_refusal_its_own_way(host):
    response = post(host.test_client(), "/patients/7/scans", form(FILE, FILE))
    assert response.status_code == 400
    assert json.loads(response.data) == {"problem": "send exactly one file per upload"}
