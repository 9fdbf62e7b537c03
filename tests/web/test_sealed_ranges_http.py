"""What a download sends when a sealed file is damaged (docs/sealed-format.md, "What is detected, and when").

Over real HTTP (Werkzeug's server on loopback), because what a client sees when
a chunk fails after the status was prepared is the WSGI server's doing, not
Flask's: the promise is that no unauthenticated byte is ever sent, that the
header, length and last chunk are proven before anything is sent, and that a
response cut by a bad chunk is visibly incomplete.
"""
from __future__ import annotations

import http.client
import os

import pytest

from cronbox.storage.format import CHUNK_SIZE, SEALED_CHUNK
from cronbox.storage.models import AuditEntry, SealedFile
from tests.storage_helpers import flip_byte, grant, put, sealed_path
from tests.web.test_storage_streaming import Server, app, private_tmp  # noqa: F401  (fixtures)
from tests.helpers import wait_for

# How the request is read, checked and streamed: the server behind the rows changes nothing, so not
# PostgreSQL too (its storage rows are tested in test_storage_http, test_storage_hardening, test_host_uploads).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")
DATA = os.urandom(4 * CHUNK_SIZE)  # chunks 0-3; the last one (3) is full


def _get(server: Server, url: str, byte_range: str | None) -> tuple[int, dict, bytes, bool]:
    """(status, headers, body received, whether the body was cut short of its Content-Length)."""
    connection = server.connection()
    connection.request("GET", url, headers={"Range": byte_range} if byte_range else {})
    response = connection.getresponse()
    try:
        body, cut = response.read(), False
    except http.client.IncompleteRead as incomplete:
        body, cut = incomplete.partial, True
    connection.close()
    return response.status, dict(response.getheaders()), body, cut


def _row(store, file_id: str) -> SealedFile:
    with store.sessions() as session:
        return session.get(SealedFile, file_id)


def _serve_outcomes(store, file_id: str) -> list[tuple[str, int]]:
    with store.sessions() as session:
        return [(e.outcome, e.bytes_sent) for e in session.query(AuditEntry).filter(
            AuditEntry.action == "serve", AuditEntry.file_id == file_id).order_by(AuditEntry.id)]


@pytest.fixture
def damaged(app):  # noqa: F811
    """A four-chunk file whose chunk 1 (a middle chunk) has one flipped bit."""
    store = app.extensions["cronbox"].storage
    file_id = put(store, DATA)
    flip_byte(store, file_id, len(DATA), chunk=1, offset=99, mask=0x10)
    with Server(app) as server:
        yield store, server, file_id


@pytest.mark.parametrize("byte_range, start, stop", [
    ("bytes=0-99", 0, 100),
    (f"bytes={CHUNK_SIZE - 100}-{CHUNK_SIZE - 1}", CHUNK_SIZE - 100, CHUNK_SIZE),
    (f"bytes={2 * CHUNK_SIZE}-{3 * CHUNK_SIZE + 10}", 2 * CHUNK_SIZE, 3 * CHUNK_SIZE + 11),
    ("bytes=-5", len(DATA) - 5, len(DATA)),
])
def test_a_range_that_skips_the_damaged_chunk_is_served_whole_and_does_not_notice(damaged, byte_range, start, stop):
    store, server, file_id = damaged
    status, headers, body, cut = _get(server, store.signed_url(grant(store, file_id)), byte_range)
    assert (status, cut, body) == (206, False, DATA[start:stop])
    wait_for(lambda: _serve_outcomes(store, file_id), "the serve audit entry")
    assert _serve_outcomes(store, file_id) == [("complete", stop - start)]
    assert _row(store, file_id).integrity_error is None  # only reading chunk 1 (storage verify) finds it


@pytest.mark.parametrize("byte_range, good", [
    (None, CHUNK_SIZE),  # the whole file: chunk 0 goes out, then the connection is cut
    (f"bytes={CHUNK_SIZE - 10}-", 10),
    (f"bytes={CHUNK_SIZE + 5}-{CHUNK_SIZE + 6}", 0),  # starts in the damaged chunk
    (f"bytes={CHUNK_SIZE}-", 0),
])
def test_a_range_reaching_the_damaged_chunk_stops_there_visibly(damaged, byte_range, good):
    store, server, file_id = damaged
    status, headers, body, cut = _get(server, store.signed_url(grant(store, file_id)), byte_range)
    start = 0 if byte_range is None else int(byte_range.split("=")[1].split("-")[0])
    if good:  # headers went out with the first body byte: the server can only drop the connection
        assert status in (200, 206) and cut and body == DATA[start:start + good]
        assert int(headers["Content-Length"]) > len(body)
        wait_for(lambda: _serve_outcomes(store, file_id), "the serve audit entry")
        assert _serve_outcomes(store, file_id) == [("integrity", good)]
    else:  # the range's first chunk is proven before any answer: our own 500, with every header
        assert (status, cut) == (500, False) and b"File unavailable" in body
        assert DATA[CHUNK_SIZE:CHUNK_SIZE + 16] not in body
        assert headers["Cache-Control"] == "no-store" and headers["X-Content-Type-Options"] == "nosniff"
        assert _serve_outcomes(store, file_id) == []  # refused before a body existed
    assert "chunk 1" in _row(store, file_id).integrity_error


@pytest.mark.parametrize("damage", ["header byte", "last chunk", "one byte cut", "chunk boundary cut",
                                    "byte appended"])
@pytest.mark.parametrize("byte_range", [None, "bytes=0-9", "bytes=-1"])
def test_header_length_and_last_chunk_damage_is_refused_before_any_byte(app, damage, byte_range):  # noqa: F811
    store = app.extensions["cronbox"].storage
    file_id = put(store, DATA)
    path = sealed_path(store, file_id)
    raw = bytearray(path.read_bytes())
    if damage == "header byte":
        raw[20] ^= 0x01
    elif damage == "last chunk":
        raw[-40] ^= 0x01
    elif damage == "one byte cut":
        del raw[-1]
    elif damage == "chunk boundary cut":
        del raw[len(raw) - SEALED_CHUNK:]
    else:
        raw += b"\x00"
    path.write_bytes(bytes(raw))
    with Server(app) as server:
        status, _headers, body, cut = _get(server, store.signed_url(grant(store, file_id)), byte_range)
    assert (status, cut) == (500, False) and b"File unavailable" in body and DATA[:16] not in body
    assert _serve_outcomes(store, file_id) == []  # refused before a body existed
    assert _row(store, file_id).integrity_error
