"""Real HTTP on loopback: memory that does not grow with the file, no plaintext anywhere, aborted bodies.

The app runs in Werkzeug's server in a thread of this process, so peak RSS
(VmHWM, reset through /proc/self/clear_refs before each transfer) covers both
the server and the streaming client. Sizes are compared, never times.
"""
from __future__ import annotations

import hashlib
import http.client
import io
import os
import socket
import tempfile
import threading
import time

import pytest
from werkzeug.serving import make_server

from app import create_app
from cronbox.outbox.core.settings import load_settings
from cronbox.storage.format import CHUNK_SIZE
from cronbox.storage.models import AuditEntry
from tests.storage_helpers import files_under, flip_byte, grant, put
from tests.helpers import wait_for

# How the request is read, checked and streamed: the server behind the rows changes nothing, so not
# PostgreSQL too (its storage rows are tested in test_storage_http, test_storage_hardening, test_host_uploads).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

MiB = 1024 * 1024
MARKER = b"PHI-MARKER-5e1f0c9a"
UPLOAD_TOKEN = "streaming-upload-token"


class Pattern(io.RawIOBase):
    """`size` bytes of a repeating 1 MiB block full of MARKER, produced on the fly (constant memory)."""

    BLOCK = (MARKER + b" " + hashlib.sha256(b"seed").hexdigest().encode() + b"\n") * (MiB // 84) + b"\n" * (MiB % 84)

    def __init__(self, size: int):
        self.remaining = size
        self.position = 0

    def readable(self):
        return True

    def readinto(self, buffer):
        count = min(len(buffer), self.remaining)
        done = 0
        while done < count:
            offset = self.position % len(self.BLOCK)
            take = min(count - done, len(self.BLOCK) - offset)
            buffer[done:done + take] = self.BLOCK[offset:offset + take]
            done += take
            self.position += take
        self.remaining -= count
        return count


def pattern_digest(size: int) -> str:
    digest, stream = hashlib.sha256(), Pattern(size)
    while chunk := stream.read(MiB):
        digest.update(chunk)
    return digest.hexdigest()


class Server:
    def __init__(self, application):
        self.server = make_server("127.0.0.1", 0, application, threaded=False)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.thread.join(timeout=30)
        self.server.server_close()

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)


def upload(server: Server, size: int) -> str:
    connection = server.connection()
    connection.request("POST", "/files", body=Pattern(size), headers={
        "Authorization": f"Bearer {UPLOAD_TOKEN}", "X-Cronbox-Owner": "patient:5", "Content-Length": str(size),
        "X-Cronbox-Filename": "marker.txt", "Content-Type": "text/plain"})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    assert response.status == 201, body
    return __import__("json").loads(body)["id"]


def download(server: Server, url: str) -> tuple[int, str]:
    connection = server.connection()
    connection.request("GET", url)
    response = connection.getresponse()
    assert response.status == 200
    digest, total = hashlib.sha256(), 0
    while chunk := response.read(256 * 1024):
        digest.update(chunk)
        total += len(chunk)
    connection.close()
    return total, digest.hexdigest()


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


def peak_growth_kb(work) -> tuple[int, object]:
    """Peak RSS above the starting RSS while `work()` runs (VmHWM reset first)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status_kb("VmRSS")
    result = work()
    return _status_kb("VmHWM") - before, result


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    folder = tmp_path / "private-tmp"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def app(runtime, env, private_tmp):
    application = create_app(load_settings(environ={**env, "CRONBOX_UPLOAD_TOKEN": UPLOAD_TOKEN,
                                                    "CRONBOX_UPLOAD_MAX": "100M"}))
    yield application
    application.extensions["cronbox"].runtime.dispose()


def _contains_marker(path) -> bool:
    overlap = b""
    with open(path, "rb") as handle:
        while block := handle.read(MiB):
            if MARKER in overlap + block:
                return True
            overlap = block[-len(MARKER):]
    return False


def test_memory_does_not_grow_with_size_and_no_plaintext_lands_anywhere(app, private_tmp, tmp_path):
    store = app.extensions["cronbox"].storage
    with Server(app) as server:
        download(server, store.signed_url(grant(store, upload(server, MiB))))  # warm-up: imports, pools, caches
        growth = {}
        for size in (8 * MiB, 64 * MiB):
            up_kb, file_id = peak_growth_kb(lambda: upload(server, size))
            url = store.signed_url(grant(store, file_id))
            down_kb, (length, digest) = peak_growth_kb(lambda: download(server, url))
            assert (length, digest) == (size, pattern_digest(size))
            growth[size] = (up_kb, down_kb)
    (up_small, down_small), (up_big, down_big) = growth[8 * MiB], growth[64 * MiB]
    # Proportional memory would add ~56 MiB between the two sizes; streaming adds nothing that depends on size.
    assert up_big - up_small < 6 * 1024, growth
    assert down_big - down_small < 6 * 1024, growth
    assert max(up_big, down_big) < 16 * 1024, growth
    checked = list(files_under(tmp_path / "instance")) + list(files_under(private_tmp))
    assert any(p.suffix == ".sealed" for p in checked) and any(p.suffix == ".log" for p in checked)
    assert [p for p in checked if _contains_marker(p)] == []


def _serve_entries(store):
    with store.sessions() as session:
        return list(session.query(AuditEntry).filter(AuditEntry.action == "serve").order_by(AuditEntry.id))


def test_a_corrupt_middle_chunk_aborts_the_connection_after_the_good_bytes(app):
    store = app.extensions["cronbox"].storage
    data = os.urandom(5 * CHUNK_SIZE)
    file_id = put(store, data)
    flip_byte(store, file_id, len(data), chunk=2, offset=7, mask=0x01)
    with Server(app) as server:
        connection = server.connection()
        connection.request("GET", store.signed_url(grant(store, file_id)))
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("Content-Length") == str(len(data))
        with pytest.raises(http.client.IncompleteRead) as incomplete:
            response.read()
        connection.close()
        assert incomplete.value.partial == data[:2 * CHUNK_SIZE]  # every authenticated byte, nothing after
        wait_for(lambda: _serve_entries(store), "the serve audit entry")
    [entry] = _serve_entries(store)
    assert (entry.outcome, entry.bytes_sent) == ("integrity", 2 * CHUNK_SIZE)
    with store.sessions() as session:
        from cronbox.storage.models import SealedFile

        assert "chunk 2" in session.get(SealedFile, file_id).integrity_error


def test_a_client_that_hangs_up_is_audited_with_the_bytes_sent(app):
    store = app.extensions["cronbox"].storage
    file_id = put(store, os.urandom(64 * CHUNK_SIZE))
    with Server(app) as server:
        connection = server.connection()
        connection.request("GET", store.signed_url(grant(store, file_id)))
        sock = connection.sock  # getresponse() drops the connection's reference on "Connection: close"
        response = connection.getresponse()
        response.read(100_000)
        sock.shutdown(socket.SHUT_RDWR)  # close() alone would leave the fd open while `response` holds it
        response.close()
        connection.close()
        wait_for(lambda: _serve_entries(store), "the serve audit entry")
    [entry] = _serve_entries(store)
    assert entry.outcome == "aborted" and 100_000 <= entry.bytes_sent < 64 * CHUNK_SIZE
