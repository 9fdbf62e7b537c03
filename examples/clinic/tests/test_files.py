"""Scans: a multipart upload to the clinic's own route is sealed while it streams (nothing in plaintext
on disk, not even Werkzeug's temporary file), a refused one leaves no file and no row, and the
absolute link the clinic hands out downloads the scan over real HTTP."""
from __future__ import annotations

import io
import os
import sys
import threading
import urllib.request
from json import loads
from pathlib import Path

import pytest
from sqlalchemy import func, select
from werkzeug.serving import make_server
from werkzeug.test import EnvironBuilder, run_wsgi_app

from conftest import STAFF

MiB = 1024 * 1024
BOUNDARY = "----clinic-test-boundary"
FORM = f"multipart/form-data; boundary={BOUNDARY}"
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

# --- every path Python opens for writing while `writes` is active (audit hooks stay for the process) ---

_writes: list[str] | None = None


def _record_writes(event: str, args: tuple) -> None:
    if event != "open" or _writes is None:
        return
    path, mode, flags = args
    if isinstance(path, int):  # os.fdopen of a descriptor whose os.open was already seen
        return
    if any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS):
        _writes.append(os.fsdecode(path))


sys.addaudithook(_record_writes)


@pytest.fixture
def writes():
    global _writes
    _writes = []
    try:
        yield _writes
    finally:
        _writes = None


def part(name: str, value: bytes, filename: str | None = None, content_type: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    head = f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"\r\n" + value + b"\r\n"


def form(*parts: bytes) -> bytes:
    """A multipart body built in memory: the test client's own encoder spools big files to a temporary file."""
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def upload(app, patient: int, body: bytes, content_type: str = FORM, *, chunked: bool = False):
    """POST the body as is: with its Content-Length, or without one as a chunked request arrives."""
    environ = EnvironBuilder(path=f"/patients/{patient}/scans", method="POST", input_stream=io.BytesIO(body),
                             content_type=content_type, headers=STAFF).get_environ()
    environ["CONTENT_LENGTH"] = str(len(body))
    if chunked:
        del environ["CONTENT_LENGTH"]
        environ["wsgi.input_terminated"] = True
    answer, status, _headers = run_wsgi_app(app, environ, buffered=True)
    return int(status.split()[0]), b"".join(answer)


@pytest.fixture
def files(app):
    """The clinic's sealed storage, its keys made before a test watches the writes."""
    from clinic import cronbox

    with app.app_context():
        store = cronbox.storage
        store.keyring()
    return store


def sealed_files(files) -> list[Path]:
    return [Path(root) / name for root, _dirs, names in os.walk(files.settings.sealed_dir) for name in names]


def rows(app) -> int:
    from clinic.models import db
    from cronbox.storage.models import SealedFile

    with app.app_context():
        return db.session.scalar(select(func.count()).select_from(SealedFile))


def read_back(app, files, file_id: str) -> bytes:
    from clinic.models import db
    from cronbox.storage.models import SealedFile

    with app.app_context():
        opened = files.open(db.session.get(SealedFile, file_id))
        try:
            return b"".join(bytes(chunk) for chunk in opened.iter_range(0, opened.size))
        finally:
            opened.close()


def test_a_5_mib_scan_is_sealed_while_it_streams_and_nothing_else_is_written(app, booked, files, writes):
    patient, _appointment = booked
    scan = os.urandom(5 * MiB)
    body = form(part("visit", b"2026-12-03"), part("scan", scan, filename="knee.pdf", content_type="application/pdf"))
    status, answer = upload(app, patient, body)
    assert status == 201, answer

    # Allowed: the sealed file's temporary and final name under <instance>/private/, and cronbox's log
    # (opened on the process's first line of the day), which must not name the file. SQLite's files are
    # written by the sqlite3 C library, which raises no Python audit event; MariaDB writes nothing here.
    assert writes, "the audit hook saw no write at all: it is not listening"
    sealed_dir = files.settings.sealed_dir.resolve()
    log = files.settings.logs_dir.resolve()
    outside = [p for p in writes if not Path(p).resolve().is_relative_to(sealed_dir)
               and not (Path(p).resolve().parent == log and Path(p).name.startswith("cronbox-"))]
    assert outside == []
    logged = b"".join(p.read_bytes() for p in log.glob("cronbox-*.log"))
    assert b"knee.pdf" not in logged and scan[:64] not in logged
    answer = loads(answer)
    assert answer["size"] == len(scan) and answer["filename"] == "knee.pdf" and answer["fields"] == {"visit": "2026-12-03"}
    assert scan not in b"".join(p.read_bytes() for p in sealed_files(files))  # sealed, not stored
    assert read_back(app, files, answer["id"]) == scan


OWNER_FILE = part("scan", b"%PDF-1.7" * 1000, filename="scan.pdf")
BAD = {
    "two file parts": (form(OWNER_FILE, part("other", b"y", filename="b.pdf")), FORM, 400),
    "no file part": (form(part("scan", b"just text")), FORM, 400),
    "a truncated body": (form(OWNER_FILE)[:3000], FORM, 400),
    "a urlencoded form": (b"scan=abc", "application/x-www-form-urlencoded", 400),
    "over CRONBOX_UPLOAD_MAX": (form(part("scan", b"x" * (6 * MiB + 1), filename="big.pdf")), FORM, 413),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_refused_scan_gets_its_status_and_leaves_no_file_or_row(case, chunked, app, booked, files):
    patient, _appointment = booked
    body, content_type, expected = BAD[case]
    status, answer = upload(app, patient, body, content_type, chunked=chunked)
    assert status == expected, answer
    assert sealed_files(files) == [] and rows(app) == 0


def test_uploads_are_for_staff_and_known_patients(app, booked, files):
    patient, _appointment = booked
    client = app.test_client()
    body = form(OWNER_FILE)
    assert client.post(f"/patients/{patient}/scans", data=body, content_type=FORM).status_code == 401
    assert client.post("/patients/999/scans", data=body, content_type=FORM, headers=STAFF).status_code == 404
    assert sealed_files(files) == [] and rows(app) == 0


@pytest.fixture
def server(clinic_env, monkeypatch):
    """A real HTTP server on a free port, its address set as CRONBOX_BASE_URL before the app is made."""
    holder = {}
    httpd = make_server("127.0.0.1", 0, lambda environ, start: holder["app"](environ, start), threaded=True)
    base = f"http://127.0.0.1:{httpd.server_port}"
    monkeypatch.setenv("CRONBOX_BASE_URL", base)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield base, holder
    httpd.shutdown()
    thread.join(10)


def test_the_absolute_link_downloads_the_scan(server, make_app, booked):
    base, holder = server
    app = holder["app"] = make_app()
    patient, _appointment = booked
    scan = os.urandom(300_000)
    status, answer = upload(app, patient, form(part("scan", scan, filename="x-ray.png", content_type="image/png")))
    assert status == 201, answer
    file_id = loads(answer)["id"]
    client = app.test_client()
    assert client.post(f"/patients/{patient + 1}/scans/{file_id}/link", headers=STAFF).status_code == 404
    assert client.post(f"/patients/{patient}/scans/not-a-file/link", headers=STAFF).status_code == 404
    linked = client.post(f"/patients/{patient}/scans/{file_id}/link", headers=STAFF)
    assert linked.status_code == 201, linked.data
    url = linked.get_json()["url"]
    assert url.startswith(f"{base}/files/")
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("image/png")
        assert response.read() == scan
