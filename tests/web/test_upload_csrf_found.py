"""`@sealed_upload_route` finds the host's Flask-WTF CSRFProtect itself (issue 35, items 4 and 5).

Item 4: without `csrf=`, on an app with CSRFProtect, Werkzeug used to spool the file part to a plaintext
temporary file (CSRFProtect reads the form before any view) and the route answered 500. Every documented
combination is run here (CSRFProtect on or off, `csrf=` given or not, the route decorator above or below,
CSRFProtect set up before or after cronbox): the check is cronbox's, a forged upload is refused, a good one
sealed, a route in the wrong order refused (CsrfNotChecked), and never a plaintext file written.

Item 5: Flask-WTF's `exempt` keys a view by `module.function`; the checking wrapper took the host view's
names (functools.wraps), so exempting it exempted any host view of the same function name in the same
module (`POST /notes2/upload` with no token answered 200). Now the key is the wrapper's alone, and every
other POST route of the host keeps its check.
"""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import pytest
from flask import Blueprint, Flask, jsonify, request
from flask_wtf.csrf import CSRFProtect, generate_csrf

from cronbox import Cronbox, seal_upload, sealed_upload_route
from tests.storage_helpers import files_under
from tests.web.test_host_uploads import FORM, form, part, rows
from tests.write_watch import writes  # noqa: F401  (the fixture)

# How the request is read and checked: the server behind the rows changes nothing.
pytestmark = pytest.mark.backends("sqlite")

SCAN = os.urandom(1024 * 1024)  # over Werkzeug's 500 KiB in-memory limit: a spool file if anything parses it
CRONBOX_BLUEPRINTS = {"files", "ops", "webcron", "health", "metrics"}


def upload_view(runtime):
    def upload():  # the same function name as the host's form views below, in the same module
        with runtime.sessions.begin() as session:
            sealed = seal_upload(session=session, owner="patient:7")
        return jsonify(id=sealed.file_id, size=sealed.size), 201
    return upload


def host_decorator(view):
    """A host's own decorator (a login check, say) written above sealed_upload_route, with functools.wraps."""
    @functools.wraps(view)
    def logged_in(*args, **kwargs):
        return view(*args, **kwargs)
    return logged_in


def form_view():
    def upload():
        return jsonify(note=request.form.get("note")), 200
    return upload


def clinic(runtime, *, wtf: bool, given: bool, route_above: bool, csrf_first: bool) -> Flask:
    """A host app whose sealed-upload route `/scans` is written as the combination says."""
    app = Flask("clinic")
    app.secret_key = "host-secret"
    csrf = CSRFProtect() if wtf else None
    if csrf is not None and csrf_first:
        csrf.init_app(app)
    Cronbox().init_app(app, settings=runtime.settings).use_runtime(runtime)
    if csrf is not None and not csrf_first:
        csrf.init_app(app)
    decorator = sealed_upload_route(csrf=csrf) if given else sealed_upload_route
    if route_above:
        app.post("/scans")(decorator(upload_view(runtime)))
    else:  # the bare view is registered; the checking wrapper is never called
        decorator(app.post("/scans")(upload_view(runtime)))
    app.add_url_rule("/token", "token", lambda: generate_csrf() if wtf else "")
    app.extensions["cronbox"].storage.keyring()  # master keys made before the write watcher listens
    return app


def outside(writes, sealed_dir: Path) -> list[str]:
    return [p for p in writes if not Path(p).resolve().is_relative_to(sealed_dir.resolve())]


def post_scan(client, *fields: bytes):
    return client.post("/scans", data=form(*fields, part("scan", SCAN, filename="scan.pdf")), content_type=FORM)


COMBINATIONS = [  # (CSRFProtect, csrf= given, route decorator above, CSRFProtect set up before cronbox)
    *[(True, given, above, first) for given in (True, False) for above in (True, False) for first in (True, False)],
    (False, False, True, False), (False, False, False, False)]


def combination_id(combination) -> str:
    wtf, given, above, first = combination
    if not wtf:
        return f"no-csrfprotect-route-{'above' if above else 'below'}"
    return "-".join([("csrf-given" if given else "csrf-found"), ("route-above" if above else "route-below"),
                     ("csrfprotect-first" if first else "cronbox-first")])


@pytest.mark.parametrize("combination", COMBINATIONS, ids=combination_id)
def test_no_combination_ever_writes_a_plaintext_spool_file(combination, runtime, writes, caplog):
    wtf, given, route_above, csrf_first = combination
    app = clinic(runtime, wtf=wtf, given=given, route_above=route_above, csrf_first=csrf_first)
    app.testing = False  # a route's bug is a 500, as in production
    client = app.test_client()
    token = client.get("/token").get_data(as_text=True)
    writes.clear()
    with caplog.at_level(logging.ERROR, logger="cronbox"):
        statuses = [post_scan(client).status_code, post_scan(client, part("csrf_token", b"forged")).status_code,
                    post_scan(client, part("csrf_token", token.encode())).status_code]
    assert outside(writes, runtime.settings.sealed_dir) == []  # no temporary file, ever
    if not wtf:
        assert statuses == [201, 201, 201] and rows(runtime) == (3, 3)
    elif route_above:
        assert statuses == [400, 400, 201] and rows(runtime) == (1, 1)
    else:  # the decorator above the route decorator: refused before anything reads the body
        assert statuses == [500, 500, 500] and rows(runtime) == (0, 0)
        assert caplog.text.count("the route has no CSRF check") == 3 and "forged" not in caplog.text
        assert list(files_under(runtime.settings.sealed_dir)) == []


def test_the_exemption_is_the_upload_routes_alone(runtime):
    """A host form view named like the upload view, in the same module, at the app and in a blueprint."""
    app = Flask("clinic")
    app.secret_key = "host-secret"
    csrf = CSRFProtect(app)
    Cronbox().init_app(app, settings=runtime.settings).use_runtime(runtime)
    app.post("/scans", endpoint="scans")(sealed_upload_route(upload_view(runtime)))
    app.post("/notes", endpoint="notes")(form_view())
    notes2 = Blueprint("notes2", __name__, url_prefix="/notes2")
    notes2.post("/upload")(form_view())
    app.register_blueprint(notes2)
    app.post("/given", endpoint="given")(sealed_upload_route(csrf=csrf)(upload_view(runtime)))
    app.post("/notes3", endpoint="notes3")(form_view())
    app.post("/guarded", endpoint="guarded")(host_decorator(sealed_upload_route(upload_view(runtime))))
    app.add_url_rule("/token", "token", generate_csrf)
    client = app.test_client()
    token = client.get("/token").get_data(as_text=True)
    for url in ["/scans", "/given", "/guarded"]:  # the upload routes themselves: checked by cronbox, then sealed
        assert post_scan_to(client, url).status_code == 400
        assert post_scan_to(client, url, part("csrf_token", token.encode())).status_code == 201

    checked = {"scans", "given", "guarded"}
    host_posts = [rule for rule in app.url_map.iter_rules() if "POST" in rule.methods
                  and rule.endpoint not in checked and rule.endpoint.partition(".")[0] not in CRONBOX_BLUEPRINTS]
    assert {rule.rule for rule in host_posts} == {"/notes", "/notes2/upload", "/notes3"}
    for rule in host_posts:
        assert client.post(rule.rule, data={"note": "hi"}).status_code == 400, rule.rule
        assert client.post(rule.rule, data={"note": "hi", "csrf_token": token}).status_code == 200, rule.rule


def post_scan_to(client, url: str, *fields: bytes):
    return client.post(url, data=form(*fields, part("scan", b"%PDF", filename="s.pdf")), content_type=FORM)
