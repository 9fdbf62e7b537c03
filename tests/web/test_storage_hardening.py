"""Issue 12 (storage slice): downloads failing on their first chunk, refusals tied to their file, the
same-use window, upload lengths, sweep's grace, floods of unsigned tokens, names shown to operators.
On every backend."""
from __future__ import annotations

import io
import os
from datetime import datetime

import pytest
from sqlalchemy import select
from werkzeug.test import EnvironBuilder, run_wsgi_app

from cronbox.outbox.core import clock
from cronbox.storage import grants, maintenance, refusals
from cronbox.storage.errors import StorageError
from cronbox.storage.format import CHUNK_SIZE
from cronbox.storage.models import AuditEntry, Grant, SealedFile
from tests.conftest import ONE_MYSQL_MODE
from tests.helpers import invoke
from tests.storage_helpers import files_under, flip_byte, grant, put, sealed_path
from tests.web.test_storage_http import app, client, store  # noqa: F401  (fixtures)
from tests.web.test_storage_http import AUTH, _flip, audit_rows, checked, make_app, uses

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)
WHOLE = os.urandom(4 * CHUNK_SIZE)  # whole chunks: flip_byte's arithmetic
T0 = datetime(2026, 3, 2, 9, 0, 0)  # on a 10-minute boundary (refusal windows are fixed)


def _log_text(store) -> str:
    return "".join(p.read_text() for p in files_under(store.settings.logs_dir))


# --- a chunk failing before the first byte ------------------------------------------------------

@pytest.mark.parametrize("chunk, range_header", [
    (0, None), (0, "bytes=0-99"), (0, f"bytes=10-{CHUNK_SIZE + 10}"),
    (1, f"bytes={CHUNK_SIZE + 5}-"), (2, f"bytes={2 * CHUNK_SIZE}-{2 * CHUNK_SIZE + 10}"),
])
def test_a_bad_first_chunk_gets_the_unavailable_page_with_every_header(client, store, chunk, range_header):
    file_id = put(store, WHOLE)
    g = grant(store, file_id, max_uses=1)
    flip_byte(store, file_id, len(WHOLE), chunk=chunk, offset=3, mask=0x40)
    headers = {"Range": range_header} if range_header else {}
    response = checked(client.get(store.signed_url(g), headers=headers))
    assert response.status_code == 500 and b"File unavailable" in response.data
    assert response.headers["Content-Type"].startswith("text/html") and "Content-Disposition" not in response.headers
    assert uses(store, g) == 0  # nothing was served: the use is not spent
    assert audit_rows(store, "serve") == []
    redeem = audit_rows(store, "redeem")[-1]
    assert (redeem.outcome, redeem.status, redeem.file_id) == ("integrity", 500, file_id)
    [bad] = maintenance.recorded_errors(store)
    assert bad.id == file_id and f"chunk {chunk}" in bad.integrity_error
    logged = _log_text(store)
    assert "redeem integrity status=500" in logged and "serve integrity status=200 bytes=0" not in logged


def test_a_good_range_before_a_bad_chunk_is_still_served(client, store):
    file_id = put(store, WHOLE)
    flip_byte(store, file_id, len(WHOLE), chunk=2, offset=3, mask=0x40)
    response = checked(client.get(store.signed_url(grant(store, file_id)), headers={"Range": "bytes=5-99"}))
    assert response.status_code == 206 and response.data == WHOLE[5:100]


# --- refusals name their file and subject --------------------------------------------------------

def test_refusals_of_a_known_grant_name_its_file_and_subject_even_after_sweep(client, store, env):
    file_id = put(store, WHOLE)
    with clock.frozen(T0):
        revoked = grant(store, file_id)
        revoked_url = store.signed_url(revoked)
        in_tx = store.sessions.begin
        with in_tx() as session:
            store.revoke(session, revoked)
        exhausted = grant(store, file_id, max_uses=1)
        first, second = store.signed_url(exhausted), store.signed_url(exhausted)
        assert get_status(client, first) == 200
        short = grant(store, file_id, expires_in=60)
        short_url = store.signed_url(short, ttl=600)
        long_ = grant(store, file_id, expires_in=7200)
        expiring_url = store.signed_url(long_, ttl=60)
        clock.advance(120)
        got = [get_status(client, url) for url in (revoked_url, second, short_url, expiring_url)]
        head = checked(client.head(revoked_url)).status_code
    assert got == [404, 404, 404, 410] and head == 404
    refused = [r for r in audit_rows(store, "redeem") if r.outcome not in ("granted", "same-use")]
    assert sorted(r.outcome for r in refused) == ["exhausted", "expired", "grant-expired", "revoked", "revoked"]
    assert {(r.file_id, r.subject) for r in refused} == {(file_id, "user:7")}

    with clock.frozen(T0.replace(month=5)):  # every grant ended over 30 days ago: sweep deletes them
        assert maintenance.sweep(store, grace=maintenance.MIN_GRACE).grants == 4
        listed = invoke(env, "storage", "audit", "--file", file_id, "--limit", "100")
    with store.sessions() as session:
        assert session.scalars(select(Grant)).all() == []
    assert listed.exit_code == 0
    for outcome in ("exhausted", "expired", "grant-expired", "revoked"):
        assert f" {outcome} " in listed.output


def get_status(client, url: str) -> int:
    return checked(client.get(url)).status_code


# --- the same-use window ------------------------------------------------------------------------

@pytest.mark.parametrize("max_uses, expected, counted", [
    (1, [200, 200, 404, 404, 404], 1),
    (2, [200, 200, 200, 200, 404], 2),
    (None, [200, 200, 200, 200, 200], 3),
])
def test_the_same_use_window_is_bounded_from_the_first_request(client, store, max_uses, expected, counted):
    """Requests every 100 s with a 120 s window: 0 and 100 are one use, 200 starts the next, and so on."""
    file_id = put(store, WHOLE)
    with clock.frozen(T0):
        g = grant(store, file_id, max_uses=max_uses, expires_in=86400)
        url = store.signed_url(g, ttl=3600)
        statuses = []
        for _ in range(5):
            statuses.append(get_status(client, url))
            clock.advance(100)
    assert statuses == expected
    assert uses(store, g) == counted


def _as(client, url: str, *, ip: str, agent: str = "Firefox/140", method: str = "GET", proxied: bool = True,
        range_header: str | None = None):
    """A request from one client: its address behind one trusted proxy (X-Forwarded-For), or the socket's."""
    headers = {"User-Agent": agent, **({"Range": range_header} if range_header else {})}
    environ = {"REMOTE_ADDR": "10.0.0.1"}
    if proxied:
        headers["X-Forwarded-For"] = ip
    else:
        environ["REMOTE_ADDR"] = ip
    return checked(client.open(url, method=method, headers=headers, environ_base=environ)).status_code


@pytest.fixture
def proxied(runtime, env):
    application = make_app(env, CRONBOX_TRUSTED_PROXIES="1")
    yield application.test_client()
    application.extensions["cronbox"].runtime.dispose()


@pytest.mark.parametrize("first, replay", [
    ({"ip": "203.0.113.5"}, {"ip": "198.51.100.9"}),
    ({"ip": "203.0.113.5"}, {"ip": "203.0.113.5", "agent": "curl/8.5"}),
    ({"ip": "2001:db8:1:2::5"}, {"ip": "2001:db8:1:3::5"}),
    ({"ip": "203.0.113.5"}, {"ip": "203.0.113.5, 198.51.100.9"}),  # the proxy saw another client
    ({"ip": "203.0.113.5", "proxied": False}, {"ip": "198.51.100.9", "proxied": False}),
    ({"ip": "203.0.113.5"}, {"ip": "198.51.100.9", "method": "HEAD"}),
    ({"ip": "203.0.113.5"}, {"ip": "198.51.100.9", "range_header": "bytes=0-99"}),
])
def test_a_used_up_link_replayed_by_another_client_in_the_window_is_refused(proxied, store, first, replay):
    """A max_uses=1 link replayed from another address inside the same-use window used to be a second full
    download: the window joins only the same client's requests."""
    file_id = put(store, WHOLE)
    with clock.frozen(T0):
        g = grant(store, file_id, max_uses=1)
        url = store.signed_url(g)
        assert _as(proxied, url, **first) == 200
        clock.advance(5)
        assert _as(proxied, url, **replay) == 404
        assert _as(proxied, url, **first, range_header="bytes=100-199") == 206  # the first client resumes
        assert _as(proxied, url, **{**first, "method": "HEAD"}) == 200
    assert uses(store, g) == 1
    outcomes = [(r.outcome, r.status, r.client_ip) for r in audit_rows(store, "redeem")]
    replayed_ip = replay["ip"].split(",")[-1].strip()
    assert outcomes[0][:2] == ("granted", 200) and ("exhausted", 404, replayed_ip) in outcomes
    assert [r.outcome for r in audit_rows(store, "serve")] == ["complete", "complete"]  # no second body


@pytest.mark.parametrize("first, again", [
    ({"ip": "2001:db8:1:2::5"}, {"ip": "2001:db8:1:2::77"}),  # one /64: one subscriber
    ({"ip": "::ffff:203.0.113.5"}, {"ip": "203.0.113.5"}),
    ({"ip": "203.0.113.5"}, {"ip": "192.0.2.66, 203.0.113.5"}),  # what the client wrote left of the proxy's hop
    ({"ip": "203.0.113.5", "proxied": False}, {"ip": "203.0.113.5", "proxied": False}),
])
def test_the_same_client_continues_its_use_in_the_window(proxied, store, first, again):
    file_id = put(store, WHOLE)
    with clock.frozen(T0):
        g = grant(store, file_id, max_uses=1)
        url = store.signed_url(g)
        assert _as(proxied, url, **first) == 200
        clock.advance(grants.SAME_USE_WINDOW - 1)
        assert _as(proxied, url, **again, range_header=f"bytes={CHUNK_SIZE}-") == 206
        assert _as(proxied, url, **again, method="HEAD") == 200
        clock.advance(2)  # the window is over: a new use, and none is left
        assert _as(proxied, url, **again, range_header=f"bytes={CHUNK_SIZE}-") == 404
    assert uses(store, g) == 1


def test_without_trusted_proxies_a_forwarded_for_header_makes_no_other_client(client, store):
    file_id = put(store, WHOLE)
    with clock.frozen(T0):
        g = grant(store, file_id, max_uses=1)
        url = store.signed_url(g)
        headers = {"User-Agent": "Firefox/140"}
        assert checked(client.get(url, headers={**headers, "X-Forwarded-For": "198.51.100.1"},
                                  environ_base={"REMOTE_ADDR": "203.0.113.5"})).status_code == 200
        assert checked(client.get(url, headers={**headers, "X-Forwarded-For": "198.51.100.2", "Range": "bytes=0-9"},
                                  environ_base={"REMOTE_ADDR": "203.0.113.5"})).status_code == 206
        assert checked(client.get(url, headers=headers, environ_base={"REMOTE_ADDR": "203.0.113.6"})).status_code == 404


def test_two_uses_go_to_two_clients_and_a_third_is_refused(proxied, store):
    file_id = put(store, WHOLE)
    with clock.frozen(T0):
        g = grant(store, file_id, max_uses=2)
        url = store.signed_url(g)
        assert _as(proxied, url, ip="203.0.113.5") == 200
        assert _as(proxied, url, ip="2001:db8:9::1") == 200
        assert _as(proxied, url, ip="198.51.100.9") == 404
        assert _as(proxied, url, ip="198.51.100.9", method="HEAD") == 404
        assert _as(proxied, url, ip="203.0.113.5", range_header="bytes=0-9") == 206
        assert _as(proxied, url, ip="2001:db8:9::2", range_header="bytes=0-9") == 206
    assert uses(store, g) == 2


# --- upload lengths -----------------------------------------------------------------------------

@pytest.mark.parametrize("length, status", [
    ("-1", 400), ("abc", 400), ("1e3", 400), (" 5", 400), ("5 ", 400), ("+5", 400), ("0x5", 400), ("٥", 400),
    ("5, 5", 400), ("99999999999999999999", 413),
])
def test_an_invalid_content_length_is_refused_and_nothing_is_sealed(app, store, length, status):
    environ = EnvironBuilder(path="/files", method="POST", input_stream=io.BytesIO(b"hello"),
                             headers={**AUTH, "X-Cronbox-Owner": "patient:1"}).get_environ()
    environ["CONTENT_LENGTH"] = length
    body, status_line, headers = run_wsgi_app(app, environ, buffered=True)
    assert int(status_line.split()[0]) == status
    assert list(files_under(store.settings.sealed_dir)) == []
    with store.sessions() as session:
        assert session.scalars(select(SealedFile)).all() == []


def test_a_valid_content_length_still_uploads(client, store):
    response = checked(client.post("/files", data=b"hello", headers={**AUTH, "X-Cronbox-Owner": "patient:1"}))
    assert response.status_code == 201 and response.json["size"] == 5


# --- sweep's grace ------------------------------------------------------------------------------

@pytest.mark.parametrize("grace, says", [("0s", "more than zero"), ("1s", "at least 1h"), ("59m", "at least 1h"),
                                         ("3599s", "at least 1h"), ("3600", "needs a unit")])
def test_a_sweep_grace_below_an_hour_is_a_usage_error(store, env, grace, says):
    sealed = store.seal(io.BytesIO(b"upload whose row has not committed yet"), filename="a.pdf",
                        content_type="application/pdf")
    result = invoke(env, "storage", "sweep", "--grace", grace)
    assert result.exit_code == 2 and says in result.output
    assert sealed_path(store, sealed.file_id).exists()


def test_a_sweep_grace_of_an_hour_removes_only_older_orphans(store, env):
    young = store.seal(io.BytesIO(b"young"), filename="a.pdf", content_type="application/pdf")
    old = store.seal(io.BytesIO(b"old"), filename="b.pdf", content_type="application/pdf")
    stamp = os.stat(sealed_path(store, old.file_id)).st_mtime - 3700
    os.utime(sealed_path(store, old.file_id), (stamp, stamp))
    result = invoke(env, "storage", "sweep", "--grace", "1h")
    assert result.exit_code == 0, result.output
    assert sealed_path(store, young.file_id).exists() and not sealed_path(store, old.file_id).exists()
    assert "--grace" in invoke(env, "storage", "sweep", "--help").output


# --- floods of unsigned tokens ------------------------------------------------------------------

def _from(client, url: str, ip: str) -> int:
    return checked(client.get(url, environ_base={"REMOTE_ADDR": ip})).status_code


def test_unsigned_token_floods_are_counted_per_client_not_recorded_one_by_one(client, store):
    file_id = put(store, WHOLE)
    flooder, other = "198.51.100.7", "2001:db8:5:6::9"
    with clock.frozen(T0):
        real = store.signed_url(grant(store, file_id))
        revoked = grant(store, file_id)
        revoked_url = store.signed_url(revoked)
        with store.sessions.begin() as session:
            store.revoke(session, revoked)
        junk = ["/files/not*a*token", "/files/" + "x" * 600, _flip(real, len(real) - 3), _flip(real, 12)]
        for n in range(50):
            assert _from(client, junk[n % len(junk)], flooder) == 404
        for n in range(5):
            assert _from(client, junk[n % len(junk)], other.replace("::9", "::a")) == 404  # same /64
        for _ in range(30):  # signed by our key: every refusal recorded, whatever the flood
            assert _from(client, revoked_url, flooder) == 404
        assert _from(client, real, flooder) == 200
        unsigned = [r for r in audit_rows(store, "redeem") if r.outcome in refusals.UNSIGNED]
        assert sum(r.client_ip == flooder for r in unsigned) == refusals.RECORDED
        assert sum(r.client_ip != flooder for r in unsigned) == 5
        assert sum(r.outcome == "revoked" for r in audit_rows(store, "redeem")) == 30
        assert maintenance.sweep(store, grace=maintenance.MIN_GRACE).refusals == 0  # the window is still open

        clock.advance(refusals.WINDOW)
        assert maintenance.sweep(store, grace=maintenance.MIN_GRACE).refusals == 1
        assert maintenance.sweep(store, grace=maintenance.MIN_GRACE).refusals == 0
        for _ in range(3):  # a new window: recorded one by one again
            _from(client, junk[0], flooder)
    [counted] = [r for r in audit_rows(store, "redeem") if r.outcome == refusals.COUNTED]
    assert counted.client_ip == flooder and counted.detail.startswith("30 more ")
    assert sum(r.client_ip == flooder for r in audit_rows(store, "redeem")
               if r.outcome in refusals.UNSIGNED) == refusals.RECORDED + 3
    assert "counting the rest" in _log_text(store)


# --- names and subjects shown to operators ------------------------------------------------------

UNSAFE_NAMES = {
    "invoice\u202efdp.exe": "invoice_fdp.exe",
    "a\x00b.pdf": "a_b.pdf",
    "\u2066x\u2069 \u2067y\u2068.pdf": "_x_ _y_.pdf",
    "\u200fright\u200e.txt": "_right_.txt",
    "c\x1bd\x85e\x7f.txt": "c_d_e_.txt",
    "\u061cm\u2028n\u2029.txt": "_m_n_.txt",
}


def test_file_names_in_the_console_are_neutralised_like_a_download(runtime, env):
    from tests.console_helpers import logged_in, make_app as console_app

    application = console_app(env, runtime, CRONBOX_OPS_SHOW_FILE_NAMES="on")
    try:
        operator = logged_in(application)
        st = application.extensions["cronbox"].storage
        for name in UNSAFE_NAMES:
            file_id = put(st, b"x", name=name)
            grant(st, file_id)
        with runtime.sessions.begin() as session:  # a row written before subjects were checked
            from cronbox.storage import audit
            audit.record(session, "redeem", "granted", subject="user:\u202e7", detail="by \x1b[2Jx")
        page = operator.get("/ops/files").get_data(as_text=True)
    finally:
        application.extensions["cronbox"].runtime.dispose()
    for _raw, cleaned in UNSAFE_NAMES.items():
        assert cleaned in page
    for char in "\x00\x1b\x7f\x85\u061c\u200e\u200f\u2028\u2029\u202e\u2066\u2067\u2068\u2069":
        assert char not in page, repr(char)
    assert "user:_7" in page


@pytest.mark.parametrize("subject", ["user:\u202e7", "user:\u20667", "user:\u200f7", "user:\x857", "user:\x007"])
def test_subjects_and_owners_with_control_or_bidi_characters_are_refused(store, client, env, subject, database):
    file_id = put(store, b"x")
    with pytest.raises(StorageError):
        grant_with(store, file_id, subject)
    with pytest.raises(StorageError):
        put(store, b"x", owner=subject)
    if database.is_postgresql and "\x00" in subject:
        return  # no older row can hold it: PostgreSQL stores no NUL in text
    with store.sessions.begin() as session:  # older rows: shown neutralised by the command line
        from cronbox.storage import audit
        audit.record(session, "redeem", "granted", file_id=file_id, subject=subject)
    listed = invoke(env, "storage", "audit", "--file", file_id)
    assert listed.exit_code == 0 and "user:_7" in listed.output
    assert not any(ch in listed.output for ch in "\u202e\u2066\u200f\x85\x00")


def grant_with(store, file_id, subject):
    with store.sessions.begin() as session:
        return store.grant(session, file_id, subject)
