"""`sealed_upload_route` written above or below the route decorator, with and without the host's
CSRFProtect (issue 24): in the wrong order the registered view is the bare one, which CSRFProtect takes
as exempt by its name; seal_upload then refuses the unchecked request (CsrfNotChecked, a 500, logged,
nothing written) instead of sealing a forged upload. And the token in a prefixed form's field
(FlaskForm(prefix=...) sends "scan-csrf_token"), as Flask-WTF accepts it. On every backend."""
from __future__ import annotations

import logging

import pytest
from flask import Flask, jsonify

from tests.storage_helpers import files_under
from tests.web.test_host_uploads import FORM, form, part, rows
from tests.web.test_upload_csrf import clinic as upload_csrf_clinic
from cronbox import seal_upload, sealed_upload_route

# How the request is read, checked and streamed: the server behind the rows changes nothing, so not
# PostgreSQL too (its storage rows are tested in test_storage_http, test_storage_hardening, test_host_uploads).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")


URL = {"route above": "/scans", "route below": "/scans-below"}


def clinic(runtime, *, wtf: bool) -> Flask:
    """test_upload_csrf's host app (its /scans in the documented order: the checked view registered), and
    /scans-below in the wrong order: the bare view registered, the checking wrapper never runs."""
    app = upload_csrf_clinic(runtime, wtf=wtf)

    def scans_below():
        with runtime.sessions.begin() as session:
            return jsonify(id=seal_upload(session=session, owner="patient:7").file_id), 201

    sealed_upload_route(csrf=app.extensions.get("csrf"))(app.post("/scans-below")(scans_below))
    return app


def post(client, *parts: bytes, url: str = "/scans", **headers):
    return client.post(url, data=form(*parts, part("scan", b"%PDF-1.7 scan", filename="s.pdf")),
                       content_type=FORM, headers=headers)


@pytest.mark.parametrize("order", ["route above", "route below"])
def test_either_order_never_seals_a_forged_upload_under_csrfprotect(order, runtime, caplog):
    app = clinic(runtime, wtf=True)
    app.testing = False  # a bug of the route is a 500, as in production
    client, url = app.test_client(), URL[order]
    token = client.get("/token").get_data(as_text=True)
    with caplog.at_level(logging.ERROR, logger="cronbox"):
        statuses = [post(client, url=url).status_code, post(client, part("csrf_token", b"forged"), url=url).status_code,
                    post(client, url=url, **{"X-CSRFToken": "forged"}).status_code]
        good = post(client, part("csrf_token", token.encode()), url=url)
    if order == "route above":
        assert statuses == [400, 400, 400] and good.status_code == 201, good.data
        assert rows(runtime) == (1, 1) and "CSRF" not in caplog.text
    else:
        assert statuses == [500, 500, 500] and good.status_code == 500
        assert caplog.text.count("the route has no CSRF check") == 4 and "forged" not in caplog.text
        assert list(files_under(runtime.settings.sealed_dir)) == [] and rows(runtime) == (0, 0)


@pytest.mark.parametrize("order", ["route above", "route below"])
def test_either_order_seals_without_csrfprotect(order, runtime):
    client = clinic(runtime, wtf=False).test_client()
    assert post(client, url=URL[order]).status_code == 201 and rows(runtime) == (1, 1)


@pytest.mark.parametrize("name", ["scan-csrf_token", "upload-scan-csrf_token", "xcsrf_token"])
def test_the_token_in_a_prefixed_field_before_the_file_is_accepted(name, runtime):
    """Flask-WTF takes WTF_CSRF_FIELD_NAME itself, else the first non-empty field whose name ends with it."""
    client = clinic(runtime, wtf=True).test_client()
    token = client.get("/token").get_data(as_text=True).encode()
    assert post(client, part(name, token)).status_code == 201
    assert post(client, part("csrf_token", b""), part(name, token)).status_code == 201  # an empty one is skipped
    assert post(client, part(name, b"forged")).status_code == 400
    assert post(client, part("csrf_token", b"forged"), part(name, token)).status_code == 400  # the exact name first
    assert post(client, part("csrf_token_x", token)).status_code == 400  # not ending with the name
    assert rows(runtime) == (2, 2)


def test_a_prefixed_token_after_the_file_is_not_seen(runtime):
    client = clinic(runtime, wtf=True).test_client()
    token = client.get("/token").get_data(as_text=True).encode()
    late = client.post("/scans", data=form(part("scan", b"%PDF", filename="s.pdf"), part("scan-csrf_token", token)),
                       content_type=FORM)
    assert late.status_code == 400 and rows(runtime) == (0, 0)
