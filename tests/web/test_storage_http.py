"""GET|HEAD /files/<token> and POST /files through Flask's test client, on every backend."""
from __future__ import annotations

import io
import os
import string
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings as hypothesis_settings, strategies as st
from sqlalchemy import select
from werkzeug.test import EnvironBuilder, run_wsgi_app

from app import create_app
from cronbox.outbox.core import clock
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.core.transactions import in_transaction
from cronbox import storage
from cronbox.storage import keys, maintenance
from cronbox.storage.format import CHUNK_SIZE
from cronbox.storage.models import AuditEntry, Grant
from cronbox.storage.tokens import Tokens
from tests.conftest import ONE_MYSQL_MODE
from tests.storage_helpers import files_under, grant, put, sealed_path

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode changes nothing these tests check

UPLOAD_TOKEN = "upload-secret-0123456789"
SECURITY = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; sandbox",
}
DATA = os.urandom(3 * CHUNK_SIZE + 1000)


def make_app(env, **extra):
    application = create_app(load_settings(environ={**env, "CRONBOX_UPLOAD_TOKEN": UPLOAD_TOKEN, **extra}))
    application.testing = True
    return application


@pytest.fixture
def app(runtime, env):
    application = make_app(env)
    yield application
    application.extensions["cronbox"].runtime.dispose()


@pytest.fixture
def store(app):
    return app.extensions["cronbox"].storage


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def file_id(store):
    return put(store, DATA, name="Résultat: scan\r\n1.pdf")


def checked(response):
    """Every answer under /files carries the security headers. Reads the body and closes the response
    (as a WSGI server does at the end of a download, which writes the "serve" audit entry)."""
    for name, value in SECURITY.items():
        assert response.headers.get(name) == value, (name, response.status_code)
    response.get_data()
    response.close()
    return response


def get(client, url, **headers):
    return checked(client.get(url, headers=headers))


def audit_rows(store, action=None):
    with store.sessions() as session:
        query = select(AuditEntry).order_by(AuditEntry.id)
        if action:
            query = query.where(AuditEntry.action == action)
        return list(session.scalars(query))


def uses(store, grant_id):
    with store.sessions() as session:
        return session.get(Grant, grant_id).uses


# --- a plain download ----------------------------------------------------------------------------

def test_download_with_every_header(client, store, file_id):
    url = store.signed_url(grant(store, file_id))
    response = get(client, url)
    assert response.status_code == 200 and response.data == DATA
    headers = response.headers
    assert headers["Content-Length"] == str(len(DATA)) and headers["Accept-Ranges"] == "bytes"
    assert headers["Content-Type"] == "application/pdf"
    assert headers["Content-Disposition"] == ("attachment; filename=\"Resultat_ scan__1.pdf\"; "
                                              "filename*=UTF-8''R%C3%A9sultat_%20scan__1.pdf")
    assert headers["ETag"].startswith('"') and len(headers["ETag"]) == 34
    served = audit_rows(store, "serve")[-1]
    assert (served.outcome, served.bytes_sent, served.status, served.client_ip) == ("complete", len(DATA), 200,
                                                                                     "127.0.0.1")
    redeem = audit_rows(store, "redeem")[-1]
    assert (redeem.outcome, redeem.range_start, redeem.range_end, redeem.subject) == ("granted", 0, len(DATA) - 1,
                                                                                      "user:7")


def test_head_answers_like_get_without_a_body_or_a_use(client, store, file_id):
    g = grant(store, file_id, max_uses=1)
    url = store.signed_url(g)
    response = checked(client.head(url))
    assert response.status_code == 200 and response.data == b""
    assert response.headers["Content-Length"] == str(len(DATA))
    assert uses(store, g) == 0
    assert checked(client.head(url, headers={"Range": "bytes=0-9"})).headers["Content-Range"] == \
        f"bytes 0-9/{len(DATA)}"


# --- absolute links for a host app's e-mails and SMS ----------------------------------------------

@pytest.mark.parametrize("base, prefix", [("https://clinic.example", ""), ("https://clinic.example/", ""),
                                          ("https://host.example/app/", "/app")])
def test_an_absolute_link_uses_the_base_url_never_the_requests_host_and_downloads(runtime, env, base, prefix):
    """A host route issuing a link for an e-mail: the request says Host: evil.example, the link does not."""
    application = make_app(env, CRONBOX_BASE_URL=base)
    store = application.extensions["cronbox"].storage

    @application.route("/host/link/<grant_id>")
    def host_link(grant_id):
        return storage.signed_url(grant_id, ttl=60, absolute=True)

    try:
        g = grant(store, put(store, DATA))
        client = application.test_client()
        for headers in ({"Host": "evil.example"}, {"Host": "evil.example", "X-Forwarded-Host": "evil.example",
                                                   "X-Forwarded-Proto": "http"}):
            link = client.get(f"/host/link/{g}", headers=headers).get_data(as_text=True)
            site = "https://" + base.split("/")[2]
            assert link.startswith(f"{site}{prefix}/files/") and "evil" not in link, link
        response = checked(client.get(link.removeprefix(site + prefix), base_url=site + prefix))  # mounted at the prefix
        assert response.status_code == 200 and response.data == DATA
    finally:
        application.extensions["cronbox"].runtime.dispose()


# --- tokens --------------------------------------------------------------------------------------

def _flip(token: str, index: int) -> str:
    chars = list(token)
    chars[index] = "A" if chars[index] != "A" else "B"
    return "".join(chars)


def test_tampered_tokens_are_a_plain_404(client, store, file_id):
    token = store.signed_url(grant(store, file_id)).removeprefix("/files/")
    payload_end = token.index(".")
    for index in (0, payload_end // 2, payload_end + 2, len(token) - 5):
        response = get(client, "/files/" + _flip(token, index))
        assert response.status_code == 404 and b"Not found" in response.data
    assert get(client, "/files/" + token).status_code == 200


def test_expired_links_get_410_and_a_short_page(client, store, file_id):
    with clock.frozen(clock.utcnow()):
        url = store.signed_url(grant(store, file_id, expires_in=86400), ttl=60)
        clock.advance(59)
        assert get(client, url).status_code == 200
        clock.advance(1)
        response = get(client, url)
        assert response.status_code == 410 and b"Link expired" in response.data
        url = store.signed_url(grant(store, file_id, expires_in=86400), ttl=store.settings.url_max_ttl)
        clock.advance(store.settings.url_max_ttl + 1)  # past max_age too: itsdangerous's own expiry
        assert get(client, url).status_code == 410
    assert audit_rows(store, "redeem")[-1].outcome == "expired"


def test_future_dated_tokens_are_404(client, store, file_id):
    g = grant(store, file_id, expires_in=86400)
    with clock.frozen(clock.utcnow() + timedelta(hours=2)):
        url = store.signed_url(g)
    response = get(client, url)
    assert response.status_code == 404
    assert audit_rows(store, "redeem")[-1].outcome == "future-dated"


def test_wrong_salt_and_wrong_key_are_404(client, store, file_id):
    g = grant(store, file_id)
    other_purpose = Tokens(store.keyring().signing_keys, max_ttl=3600, salt="cronbox.something-else")
    assert get(client, "/files/" + other_purpose.issue(g, 60)[0]).status_code == 404
    other_key = Tokens([os.urandom(32)], max_ttl=3600)
    assert get(client, "/files/" + other_key.issue(g, 60)[0]).status_code == 404
    assert {r.outcome for r in audit_rows(store, "redeem")} == {"bad-signature"}


def test_revoked_and_exhausted_grants_are_404(client, store, file_id):
    g = grant(store, file_id, max_uses=1)
    first, second = store.signed_url(g), store.signed_url(g)
    assert get(client, first).status_code == 200
    assert get(client, second).status_code == 404  # another token: a second use, none left
    assert get(client, first, Range="bytes=0-0").status_code == 206  # the same token again: the same use
    revoked = grant(store, file_id)
    url = store.signed_url(revoked)
    in_transaction(store.sessions, lambda s: store.revoke(s, revoked))
    assert get(client, url).status_code == 404
    unknown = Tokens(store.keyring().signing_keys, max_ttl=3600).issue("0" * 32, 60)[0]
    assert get(client, "/files/" + unknown).status_code == 404
    outcomes = [r.outcome for r in audit_rows(store, "redeem")]
    assert outcomes == ["granted", "exhausted", "same-use", "revoked", "unknown-grant"]


def _malleable_variants(token: str) -> list[str]:
    """Other spellings of the same signature: the last base64 character carries 2 unused bits."""
    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"
    last = alphabet.index(token[-1])
    return [token[:-1] + alphabet[(last & ~3) | low] for low in range(4) if (last & ~3) | low != last]


def test_malleable_variants_of_one_token_count_as_one_use(client, store, file_id):
    g = grant(store, file_id, max_uses=1)
    token = store.signed_url(g).removeprefix("/files/")
    variants = _malleable_variants(token)
    assert len(variants) == 3
    for variant in [token, *variants]:
        assert get(client, "/files/" + variant).status_code == 200
    assert uses(store, g) == 1


def test_rotated_signing_keys_keep_old_links_working(client, store, file_id):
    g = grant(store, file_id)
    old_url = store.signed_url(g)
    old_key = store.keyring().signing[-1]
    keys.new_key(store.settings, keys.SIGNING)
    new_url = store.signed_url(g)
    assert old_url != new_url
    assert get(client, old_url).status_code == 200 and get(client, new_url).status_code == 200
    (store.settings.key_folder / f"{old_key.id}.key").unlink()  # retired after the longest TTL
    assert get(client, old_url).status_code == 404 and get(client, new_url).status_code == 200


@pytest.mark.parametrize("path", [
    "/files/..%2F..%2Fetc%2Fpasswd", "/files/%2e%2e", "/files/..", "/files/a/b", "/files/%00",
    "/files/x%0d%0aSet-Cookie:%20a=b", "/files/" + "A" * 600, "/files/abc.def.ghi", "/files/%E2%80%AE",
    "/files/eyJnIjoiMCJ9", "/files/", "/files//etc/passwd",
])
def test_path_tricks_are_404_with_the_headers(client, store, path):
    response = get(client, path)
    assert response.status_code == 404, path
    assert b"Not found" in response.data


# --- ranges --------------------------------------------------------------------------------------

@pytest.mark.parametrize("header, start, stop", [
    ("bytes=0-0", 0, 1),
    ("bytes=65530-65545", 65530, 65546),  # across a chunk boundary
    (f"bytes={2 * CHUNK_SIZE - 1}-{2 * CHUNK_SIZE}", 2 * CHUNK_SIZE - 1, 2 * CHUNK_SIZE + 1),
    ("bytes=-100", len(DATA) - 100, len(DATA)),  # suffix
    ("bytes=-999999999", 0, len(DATA)),
    ("bytes=100000-", 100000, len(DATA)),  # open-ended
    (f"bytes=10-{len(DATA) * 2}", 10, len(DATA)),  # clamped
    ("BYTES = 5-9", 5, 10),
])
def test_single_ranges(client, store, file_id, header, start, stop):
    response = get(client, store.signed_url(grant(store, file_id)), Range=header)
    assert response.status_code == 206
    assert response.data == DATA[start:stop]
    assert response.headers["Content-Range"] == f"bytes {start}-{stop - 1}/{len(DATA)}"
    assert response.headers["Content-Length"] == str(stop - start)


@pytest.mark.parametrize("header", [f"bytes={len(DATA)}-", f"bytes={len(DATA) + 5}-{len(DATA) + 9}", "bytes=-0"])
def test_unsatisfiable_ranges_are_416(client, store, file_id, header):
    response = get(client, store.signed_url(grant(store, file_id, max_uses=1)), Range=header)
    assert response.status_code == 416 and response.data == b""
    assert response.headers["Content-Range"] == f"bytes */{len(DATA)}"


@pytest.mark.parametrize("header", ["bytes=0-1,5-6", "bytes=5-1", "items=0-5", "bytes=", "bytes=abc", "bytes=--5",
                                    "bytes=0-1, 2-3, 4-5"])
def test_multiple_and_malformed_ranges_get_the_whole_file(client, store, file_id, header):
    response = get(client, store.signed_url(grant(store, file_id)), Range=header)
    assert response.status_code == 200 and response.data == DATA


def test_if_range(client, store, file_id):
    url = store.signed_url(grant(store, file_id))
    etag = get(client, url).headers["ETag"]
    assert get(client, url, Range="bytes=0-9", **{"If-Range": etag}).status_code == 206
    for other in ('"0123"', "W/" + etag, "Wed, 21 Oct 2015 07:28:00 GMT"):
        response = get(client, url, Range="bytes=0-9", **{"If-Range": other})
        assert response.status_code == 200 and response.data == DATA


def test_empty_file(client, store):
    empty = put(store, b"", name="empty.txt", content_type="text/plain")
    url = store.signed_url(grant(store, empty))
    response = get(client, url)
    assert response.status_code == 200 and response.data == b"" and response.headers["Content-Length"] == "0"
    assert get(client, url, Range="bytes=0-0").status_code == 416


def test_truncated_file_fails_before_any_body_byte(client, store, file_id):
    g = grant(store, file_id, max_uses=1)
    path = sealed_path(store, file_id)
    path.write_bytes(path.read_bytes()[:-1])
    response = get(client, store.signed_url(g))
    assert response.status_code == 500 and b"File unavailable" in response.data and DATA[:16] not in response.data
    assert uses(store, g) == 0
    [bad] = maintenance.recorded_errors(store)
    assert bad.id == file_id


# --- uploads -------------------------------------------------------------------------------------

AUTH = {"Authorization": f"Bearer {UPLOAD_TOKEN}"}


def _no_sealed_files(store):
    return [p for p in files_under(store.settings.sealed_dir)]


def test_raw_upload_then_download(client, store):
    response = checked(client.post("/files", data=DATA, headers={
        **AUTH, "X-Cronbox-Owner": "patient:9", "X-Cronbox-Filename": "r%C3%A9sum%C3%A9.pdf",
        "Content-Type": "application/pdf"}))
    assert response.status_code == 201 and response.json["size"] == len(DATA)
    file_id = response.json["id"]
    download = get(client, store.signed_url(grant(store, file_id)))
    assert download.data == DATA and "r%C3%A9sum%C3%A9.pdf" in download.headers["Content-Disposition"]
    put_entry = audit_rows(store, "put")[-1]
    assert put_entry.subject == "patient:9" and put_entry.detail.endswith("by upload-token")


def test_multipart_upload(client, store):
    response = checked(client.post("/files", headers=AUTH, content_type="multipart/form-data", data={
        "owner": "patient:3", "file": (io.BytesIO(DATA), "x-ray.png", "image/png")}))
    assert response.status_code == 201, response.json
    download = get(client, store.signed_url(grant(store, response.json["id"])))
    assert download.data == DATA and download.headers["Content-Type"] == "image/png"


@pytest.mark.parametrize("headers, status", [
    ({}, 401),
    ({"Authorization": "Bearer wrong"}, 401),
    ({"Authorization": f"Basic {UPLOAD_TOKEN}"}, 401),
    ({**AUTH}, 400),  # no owner
    ({**AUTH, "X-Cronbox-Owner": "p:1", "X-Cronbox-Filename": "%FF%FE"}, 400),
    ({**AUTH, "X-Cronbox-Owner": "p:1", "X-Cronbox-Filename": "x" * 300}, 400),
    ({**AUTH, "X-Cronbox-Owner": "p" * 192}, 400),  # owner too long: refused before sealing, not a 500
    ({**AUTH, "X-Cronbox-Owner": "p:\t1"}, 400),  # a control character (legal in a header)
    ({**AUTH, "X-Cronbox-Owner": "p:1", "Content-Type": "application/x-www-form-urlencoded"}, 400),  # not a file
    ({**AUTH, "X-Cronbox-Owner": "p:1", "Content-Type": "multipart/mixed; boundary=b"}, 400),
])
def test_upload_refusals_leave_nothing_behind(client, store, headers, status):
    response = checked(client.post("/files", data=b"secret scan", headers=headers))
    assert response.status_code == status
    assert _no_sealed_files(store) == []


def _without_length(body: bytes, headers: dict, *, terminated: bool) -> dict:
    """A WSGI environ for a body sent without Content-Length (chunked when `terminated`)."""
    environ = EnvironBuilder(path="/files", method="POST", input_stream=io.BytesIO(body), headers=headers).get_environ()
    environ.pop("CONTENT_LENGTH", None)
    if terminated:
        environ["wsgi.input_terminated"] = True
    return environ


def _status(application, environ: dict) -> int:
    """Call the app with this exact environ (the test client would rebuild it, Content-Length included)."""
    body, status, _headers = run_wsgi_app(application, environ, buffered=True)
    return int(status.split()[0])


def test_upload_size_limit(runtime, env):
    application = make_app(env, CRONBOX_UPLOAD_MAX="100K")
    client, store = application.test_client(), application.extensions["cronbox"].storage
    headers = {**AUTH, "X-Cronbox-Owner": "p:1"}
    assert checked(client.post("/files", data=b"x" * (100 * 1024 + 1), headers=headers)).status_code == 413

    # A chunked body has no Content-Length: the limit is enforced while sealing.
    assert _status(application, _without_length(b"y" * 200 * 1024, headers, terminated=True)) == 413
    assert _status(application, _without_length(b"y", headers, terminated=False)) == 411
    response = client.post("/files", headers=AUTH, content_type="multipart/form-data", data={
        "owner": "p:1", "file": (io.BytesIO(b"z" * (100 * 1024 + 1)), "big.bin")})
    assert response.status_code == 413
    assert _no_sealed_files(store) == []
    assert checked(client.post("/files", data=b"x" * (100 * 1024), headers=headers)).status_code == 201
    application.extensions["cronbox"].runtime.dispose()


def test_multipart_with_two_files_is_refused(client, store):
    response = client.post("/files", headers=AUTH, content_type="multipart/form-data", data={
        "owner": "p:1", "a": (io.BytesIO(b"one"), "a.txt"), "b": (io.BytesIO(b"two"), "b.txt")})
    assert response.status_code == 400 and _no_sealed_files(store) == []


def test_uploads_are_off_without_a_token(runtime, env):
    application = create_app(load_settings(environ=env))
    response = checked(application.test_client().post("/files", data=b"x", headers={"Authorization": "Bearer x"}))
    assert response.status_code == 404
    application.extensions["cronbox"].runtime.dispose()


@pytest.mark.parametrize("proxies, expected", [("0", "127.0.0.1"), ("1", "10.0.0.2"), ("2", "203.0.113.9"),
                                               ("3", "127.0.0.1")])
def test_client_ip_in_the_audit_follows_trusted_proxies(runtime, env, proxies, expected):
    application = make_app(env, CRONBOX_TRUSTED_PROXIES=proxies)
    store = application.extensions["cronbox"].storage
    url = store.signed_url(grant(store, put(store, b"x")))
    application.test_client().get(url, headers={"X-Forwarded-For": "203.0.113.9, 10.0.0.2",
                                                "User-Agent": "Mozilla/5.0 test"})
    entry = audit_rows(store, "redeem")[-1]
    assert entry.client_ip == expected and entry.user_agent == "Mozilla/5.0 test"
    application.extensions["cronbox"].runtime.dispose()


# --- fuzz ----------------------------------------------------------------------------------------

FUZZ = hypothesis_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
_TOKEN_ALPHABET = string.ascii_letters + string.digits + "-_.%/~!$&'()*+,;=:@"


_SENDABLE = st.characters(codec="utf-8")  # no lone surrogates: they cannot be put in a URL at all


@FUZZ
@given(mutation=st.one_of(st.text(_SENDABLE, max_size=300), st.text(alphabet=_TOKEN_ALPHABET, max_size=300),
                          st.tuples(st.integers(min_value=0, max_value=400), _SENDABLE)))
def test_fuzzed_tokens_never_5xx(client, store, file_id, mutation):
    if isinstance(mutation, tuple):
        token = store.signed_url(grant(store, file_id)).removeprefix("/files/")
        index, char = mutation
        index %= len(token)
        token = token[:index] + char + token[index + 1:]
    else:
        token = mutation
    response = client.get("/files/" + token.replace("?", "%3F").replace("#", "%23"))
    assert response.status_code < 500, token
    checked(response)


@pytest.fixture
def fuzz_url(store, file_id):
    return store.signed_url(grant(store, file_id))


_RANGE_ALPHABET = "bytes=0123456789-, "


@FUZZ
@given(range_header=st.one_of(st.text(_SENDABLE, max_size=60), st.text(alphabet=_RANGE_ALPHABET, max_size=40),
                              st.builds(lambda a, b: f"bytes={a}-{b}", st.integers(-5, 10 ** 7) | st.just(""),
                                        st.integers(-5, 10 ** 7) | st.just(""))),
       if_range=st.none() | st.text(_SENDABLE, max_size=40))
def test_fuzzed_ranges_never_5xx(client, fuzz_url, range_header, if_range):
    headers = {"Range": range_header}
    if if_range is not None:
        headers["If-Range"] = if_range
    try:
        response = client.get(fuzz_url, headers=headers)
    except ValueError:  # a header value the HTTP client itself refuses to send (e.g. a newline)
        return
    assert response.status_code in (200, 206, 416)
    checked(response)
    if response.status_code == 206:
        first, last = map(int, response.headers["Content-Range"].split(" ")[1].split("/")[0].split("-"))
        assert response.data == DATA[first:last + 1]
    elif response.status_code == 200:
        assert response.data == DATA
