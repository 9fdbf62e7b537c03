"""Whatever a client sends in a header, form field, query or path parameter cronbox parses, the answer is never
a 5xx (issue 35, item 6).

What was found: `X-CSRF-Token: ².<mac>` on `POST /files` from a host's logged-in user was a 500, because
`str.isdigit()` takes "²" and `int()` does not. Every value cronbox parses is now read ASCII-strict; here each
of them is thrown arbitrary text (and, for headers, any byte a server may hand over as latin-1) through the
real Flask test client, in a host app with Flask-WTF's CSRFProtect, the host's login hooks and every part of
cronbox switched on. Exceptions propagate (TESTING), so a crash fails with its traceback. On SQLite: the
parsing is the same whatever the database.
"""
from __future__ import annotations

import io
from urllib.parse import quote

import pytest
from flask import Flask, jsonify
from flask_wtf.csrf import CSRFProtect, generate_csrf
from hypothesis import HealthCheck, example, given, settings, strategies as st

from cronbox import Cronbox, seal_upload, sealed_upload_route
from cronbox.cron.scheduling import once as once_requests
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.core.text import ascii_number
from cronbox.web.ranges import Plan, plan
from cronbox.storage.tokens import TokenRefused
from tests.conftest import thorough
from tests.console_helpers import csrf_token

pytestmark = pytest.mark.backends("sqlite")

FUZZ = settings(max_examples=thorough(200), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
UPLOAD_TOKEN, CRON_TOKEN, HEALTH_TOKEN = "upload-token-0123456789", "cron-token-0123456789", "health-token-0123456789"
BOUNDARY = "fuzz-boundary"

digitish = st.text(st.sampled_from("0123456789²³¹٠١٢٣੧۹𝟗０-+_ ."), min_size=1, max_size=24)
any_text = st.text(st.characters(codec="utf-8"), max_size=60)
# Values shaped like what is parsed (digits, a dot, a dash, a tilde), so the fuzz gets past the first check.
shaped = st.one_of(any_text, st.builds("{}.{}".format, digitish, any_text),
                   st.builds("bytes={}-{}".format, digitish, digitish), st.builds("{}~{}".format, any_text, digitish),
                   digitish)
# A form field or a query/path parameter: any Unicode text (sent as UTF-8), shaped ones too.
field_text = shaped


def as_header(text: str) -> str:
    """`text` as a server hands a header to WSGI: its UTF-8 bytes decoded as latin-1 ("²" arrives as "Â²";
    a byte 0xB2 alone as "²"), no CR or LF (a server never passes those on)."""
    return text.encode("utf-8").decode("latin-1").replace("\r", "").replace("\n", "")


# A header: any byte but CR and LF as latin-1 ("²" is byte 0xB2), or a shaped value's UTF-8.
header_text = st.one_of(st.text(st.characters(max_codepoint=0xFF, exclude_characters="\r\n"), max_size=60),
                        shaped.map(as_header))


@pytest.fixture
def app(runtime, env, tmp_path):
    host = Flask("clinic", root_path=str(tmp_path))
    host.config.update(SECRET_KEY="the clinic's", TESTING=True)
    CSRFProtect(host)
    config = load_settings(environ={**env, "CRONBOX_UPLOAD_TOKEN": UPLOAD_TOKEN, "CRONBOX_CRON_TOKEN": CRON_TOKEN,
                                    "CRONBOX_HEALTH_TOKEN": HEALTH_TOKEN, "CRONBOX_TRUSTED_PROXIES": "1"})
    Cronbox().init_app(host, settings=config, console_operator=lambda req: "staff:alice",
                       upload_operator=lambda req: "staff:alice").use_runtime(runtime)

    @host.post("/scans")
    @sealed_upload_route
    def scans():
        with runtime.sessions.begin() as session:
            return jsonify(id=seal_upload(session=session, owner="patient:1").file_id), 201

    host.add_url_rule("/token", "token", generate_csrf)
    return host


@pytest.fixture
def signed_link(app, runtime):
    st_ = app.extensions["cronbox"].storage
    with runtime.sessions.begin() as session:
        file_id = st_.put(session, io.BytesIO(b"%PDF-1.7 " * 100), filename="scan.pdf",
                          content_type="application/pdf", owner="patient:1")
    with runtime.sessions.begin() as session:
        grant = st_.grant(session, file_id, "patient:1")
    return st_.signed_url(grant, ttl=3600)


def no_5xx(response, what, *, allowed: tuple[int, ...] = ()) -> None:
    """`allowed`: a 5xx the endpoint answers by design whatever the request (/health's 503 while it fails)."""
    assert response.status_code < 500 or response.status_code in allowed, (
        what, response.status_code, response.get_data(as_text=True)[:300])


def multipart(*parts: tuple[str, bytes]) -> bytes:
    head = '--{}\r\nContent-Disposition: form-data; name="{}"\r\n\r\n'
    body = b"".join(head.format(BOUNDARY, name).encode("utf-8", "surrogatepass")
                    + value + b"\r\n"
                    for name, value in parts)
    file_part = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="scan"; filename="s.pdf"\r\n'
                 f"Content-Type: application/pdf\r\n\r\n%PDF-1.7 scan\r\n--{BOUNDARY}--\r\n").encode()
    return body + file_part


FORM = f"multipart/form-data; boundary={BOUNDARY}"


@FUZZ
@given(token=header_text)
@example(token="².c2lnbmF0dXJl")
@example(token="9" * 5000 + ".mac")
@example(token="9" * 400 + ".mac")
@example(token=as_header("١٢٣٤.mac"))
@example(token="+1.mac")
def test_the_upload_csrf_token_of_a_host_user(app, token):
    client = app.test_client()
    no_5xx(client.post("/files", data=b"%PDF", content_type="application/pdf",
                       headers={"X-CSRF-Token": token, "X-Cronbox-Owner": "patient:1"}), "header")
    no_5xx(client.post("/files", data=multipart(("csrf_token", token.encode("latin-1"))), content_type=FORM,
                       headers={"X-Cronbox-Owner": "patient:1"}), "field")  # any bytes, not only UTF-8


@FUZZ
@given(path=field_text, range_header=header_text, if_range=st.one_of(st.none(), header_text))
@example(path="abc\n", range_header=as_header("bytes=٠-٣"), if_range=None)
@example(path="a", range_header="bytes=-²", if_range=None)
def test_a_download_token_and_its_range_headers(app, signed_link, path, range_header, if_range):
    client = app.test_client()
    no_5xx(client.get("/files/" + quote(path, safe="")), "token")
    headers = {"Range": range_header, **({"If-Range": if_range} if if_range is not None else {})}
    no_5xx(client.get(signed_link, headers=headers), "range")
    no_5xx(client.head(signed_link, headers=headers), "range (HEAD)")


@FUZZ
@given(name=st.sampled_from(["X-Cronbox-Filename", "X-Cronbox-Owner", "Content-Type", "CONTENT_LENGTH"]),
       value=header_text)
@example(name="CONTENT_LENGTH", value="²")
@example(name="CONTENT_LENGTH", value="9" * 5000)
def test_the_headers_of_an_upload(app, name, value):
    headers = {"Authorization": f"Bearer {UPLOAD_TOKEN}", "X-Cronbox-Owner": "patient:1",
               "Content-Type": "application/pdf"}
    environ = {}
    if name == "CONTENT_LENGTH":
        environ["CONTENT_LENGTH"] = value
    else:
        headers[name] = value
    no_5xx(app.test_client().post("/files", data=b"%PDF-1.7 scan", headers=headers, environ_overrides=environ),
           name)


@FUZZ
@given(target=st.sampled_from([("GET", "/health"), ("GET", "/metrics"), ("POST", "/cron/tick"), ("POST", "/files")]),
       authorization=st.one_of(header_text, st.builds("Bearer {}".format, header_text)),
       forwarded=st.tuples(header_text, header_text))
def test_bearer_tokens_and_forwarded_headers(app, target, authorization, forwarded):
    method, url = target
    headers = {"Authorization": authorization, "X-Forwarded-For": forwarded[0], "X-Forwarded-Proto": forwarded[1]}
    no_5xx(app.test_client().open(url, method=method, headers=headers, data=b"%PDF"), url,
           allowed=(503,) if url == "/health" else ())


@FUZZ
@given(token=header_text, referrer=header_text)
@example(token="².x", referrer="https://localhost/²")
def test_the_hosts_csrf_token_on_a_sealed_upload_route(app, token, referrer):
    client = app.test_client(use_cookies=True)
    no_5xx(client.post("/scans", data=b"%PDF", content_type="application/pdf", headers={"X-CSRFToken": token}),
           "header")
    no_5xx(client.post("/scans", data=multipart(("csrf_token", token.encode("latin-1"))), content_type=FORM),
           "field")
    good = client.get("/token", base_url="https://localhost").get_data(as_text=True)
    no_5xx(client.post("/scans", data=b"%PDF", content_type="application/pdf", base_url="https://localhost",
                       headers={"X-CSRFToken": good, "Referer": referrer}), "referrer")


CONSOLE_QUERIES = [("/ops/outbox", "after"), ("/ops/queues", "after"), ("/ops/queues", "queue"),
                   ("/ops/files", "after"), ("/ops/files", "grants_after"), ("/ops/files", "file"),
                   ("/ops/files", "subject"), ("/ops/files", "outcome"), ("/ops/activity", "after"),
                   ("/ops/once", "after"), ("/ops/once", "command"), ("/ops/", "next"), ("/ops/once/", None)]


@FUZZ
@given(where=st.sampled_from(CONSOLE_QUERIES), value=field_text)
@example(where=("/ops/outbox", "after"), value="2024-01-01T00:00:00~١٢")
@example(where=("/ops/queues", "queue"), value="sms\n")
def test_the_consoles_query_parameters(app, where, value):
    path, name = where
    if name is None:  # a path parameter
        no_5xx(app.test_client().get(path + quote(value, safe="")), where)
        return
    no_5xx(app.test_client().get(path, query_string={name: value}), where)


CONSOLE_FORMS = [("/ops/outbox/retry", "id"), ("/ops/outbox/skip", "id"), ("/ops/outbox/retry", "upto"),
                 ("/ops/queues/retry", "id"), ("/ops/queues/retry", "queue"), ("/ops/queues/forget", "id"),
                 ("/ops/queues/resume", "channel"), ("/ops/schedule/run", "task"), ("/ops/once", "command"),
                 ("/ops/files/revoke", "grant"), ("/ops/once", "csrf_token")]


@FUZZ
@given(where=st.sampled_from(CONSOLE_FORMS), value=field_text)
@example(where=("/ops/outbox/retry", "id"), value="١٢")
@example(where=("/ops/outbox/retry", "id"), value="²")
@example(where=("/ops/outbox/retry", "id"), value="9" * 5000)
def test_the_consoles_form_fields(app, where, value):
    client = app.test_client()
    path, name = where
    form = {"csrf_token": csrf_token(client.get("/ops/once").get_data(as_text=True)), name: value}
    if name == "upto":  # read with all=yes: retry every dead delivery up to that id
        form["all"] = "yes"
    no_5xx(client.post(path, data=form), where)


@FUZZ
@given(cookie=header_text, token=header_text)
def test_the_consoles_cookie_and_upload_token(app, cookie, token):
    client = app.test_client()
    client.set_cookie("cronbox_ops", cookie, path="/ops")
    no_5xx(client.get("/ops/once"), "cookie")
    no_5xx(client.post("/ops/upload", data=multipart(("csrf_token", token.encode("latin-1"))), content_type=FORM),
           "upload field")
    no_5xx(client.post("/ops/upload", data=b"%PDF", content_type="application/pdf", headers={"X-CSRF-Token": token}),
           "upload header")


@FUZZ
@given(boundary=header_text, body=st.binary(max_size=400), shaped_body=st.lists(st.tuples(field_text, st.binary(
    max_size=40)), max_size=3))
def test_multipart_bodies(app, boundary, body, shaped_body):
    client = app.test_client()
    headers = {"Authorization": f"Bearer {UPLOAD_TOKEN}"}
    no_5xx(client.post("/files", data=body, content_type=f"multipart/form-data; boundary={boundary}",
                       headers=headers), "any body")
    parts = [(name.replace('"', "").replace("\r", "").replace("\n", ""), value) for name, value in shaped_body]
    no_5xx(client.post("/files", data=multipart(*parts), content_type=FORM, headers=headers), "fields")


def test_numbers_and_names_are_read_ascii_strict(app, runtime):
    """What the fuzz cannot see by status alone: digits of other scripts, which int() takes ("١٢" is 12), and
    a final newline, which a regex's `$` takes, are refused, never read as something else."""
    client = app.test_client()
    assert client.get("/ops/outbox", query_string={"after": "2024-01-01T00:00:00~١٢"}).status_code == 400
    assert client.get("/ops/activity", query_string={"after": "١٢"}).status_code == 400
    assert client.get("/ops/activity", query_string={"after": "1_2"}).status_code == 400
    assert client.get("/ops/queues", query_string={"queue": "sms\n"}).status_code == 400
    with runtime.sessions.begin() as session:
        run = once_requests.add(session, ["queue", "status"], source="test").id
    assert client.get(f"/ops/once/{run}").status_code == 200
    assert client.get("/ops/once/" + quote(str(run).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")))
                      ).status_code == 404
    token = csrf_token(client.get("/ops/once").get_data(as_text=True))
    for value in ["١٢", "+12", " 12", "1_2", "²"]:
        assert client.post("/ops/queues/forget", data={"id": value, "csrf_token": token}).status_code == 400, value
    assert plan("bytes=٠-٣", None, '"etag"', 100) == Plan(200, 0, 100)  # ignored as malformed: the whole file
    assert plan("bytes=0-3", None, '"etag"', 100) == Plan(206, 0, 4)
    with pytest.raises(TokenRefused, match="malformed"):
        app.extensions["cronbox"].storage.tokens().verify("abc\n")
    assert [ascii_number(text, 5) for text in ["12", "١٢", "²", "+1", " 1", "1_0", "", "123456", "00042"]] == [
        12, None, None, None, None, None, None, None, 42]
