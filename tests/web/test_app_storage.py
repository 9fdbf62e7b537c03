"""Which sealed store a call in a host app uses (issue 24): the current app's, from the settings its
`init_app` resolved, through the module-level `storage.*` and through `Cronbox.storage` alike.

Two Flask apps in one process, each with its own instance folder, seal under their own keys; a
request that moves the working directory and CRONBOX_* variables before sealing still seals under
its app's keys, and the link it makes downloads.
"""
from __future__ import annotations

import inspect
import io
import os
from pathlib import Path

import pytest
from flask import Flask

from cronbox import storage
from cronbox import Cronbox
from cronbox.storage.service import Storage

# The app's storage routes and forms: the server behind the rows changes nothing, so not PostgreSQL too
# (.ci/run's 30 minutes; storage rows are tested on it by test_storage_api, test_storage_http, test_storage_hardening).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")


def host_app(runtime, root: Path, name: str, **config) -> tuple[Flask, Cronbox]:
    """A host app with its own root and instance folder, on the test's database."""
    app = Flask(name, root_path=str(root), instance_path=str(root / "instance"))
    app.config.update(CRONBOX_DATABASE_URL=runtime.settings.database_url, CRONBOX_APP_ROOT=str(root), **config)
    cronbox = Cronbox()
    cronbox.init_app(app).use_runtime(runtime)
    return app, cronbox


def key_folders(under: Path) -> list[Path]:
    return sorted({path.parent for path in under.rglob("*.key")})


def read(opened) -> bytes:
    try:
        return b"".join(bytes(part) for part in opened.iter_range(0, opened.size))
    finally:
        opened.close()


def test_two_apps_in_one_process_seal_under_their_own_keys(runtime, tmp_path):
    first, first_cronbox = host_app(runtime, tmp_path / "first", "first")
    second, second_cronbox = host_app(runtime, tmp_path / "second", "second")
    with runtime.sessions.begin() as session:
        with first.app_context():
            one = storage.put(session, io.BytesIO(b"first's scan"), filename="a.txt", content_type="text/plain",
                              owner="patient:1")
        with second.app_context():
            two = second_cronbox.storage.put(session, io.BytesIO(b"second's scan"), filename="b.txt",
                                             content_type="text/plain", owner="patient:2")
    assert key_folders(tmp_path) == [tmp_path / "first" / "instance" / "cronbox" / "keys",
                                     tmp_path / "second" / "instance" / "cronbox" / "keys"]
    with runtime.sessions() as session:
        with first.app_context():
            assert read(storage.open_file(session, one)) == b"first's scan"
            assert first_cronbox.storage is storage.current() is first.extensions["cronbox"].storage
            with pytest.raises(storage.UnknownKey):
                storage.open_file(session, two)  # sealed under the other app's key
        with second.app_context():
            assert read(second_cronbox.storage.open_file(session, two)) == b"second's scan"
            assert second_cronbox.storage is storage.current() is not first.extensions["cronbox"].storage


MOVES = {
    "cwd": lambda away, mp: mp.chdir(away),
    "instance": lambda away, mp: mp.setenv("CRONBOX_INSTANCE", str(away)),
    "app-root": lambda away, mp: mp.setenv("CRONBOX_APP_ROOT", str(away)),
    "keys": lambda away, mp: mp.setenv("CRONBOX_KEYS", str(away / "keys")),
    "all": lambda away, mp: [move(away, mp) for name, move in MOVES.items() if name != "all"],
}


@pytest.mark.parametrize("moved", sorted(MOVES))
def test_a_request_that_moves_cwd_or_environ_still_seals_under_its_apps_keys(runtime, tmp_path, monkeypatch, moved):
    """The store is built on first use, here after the move: from the settings init_app resolved."""
    away = tmp_path / "away"
    away.mkdir()
    app, _cronbox = host_app(runtime, tmp_path / "clinic", "clinic")

    @app.post("/scan")
    def scan():
        MOVES[moved](away, monkeypatch)
        with runtime.sessions.begin() as session:
            file_id = storage.put(session, io.BytesIO(b"scan"), filename="s.txt", content_type="text/plain",
                                  owner="patient:3")
            grant_id = storage.grant(session, file_id, "patient:3")
        return storage.signed_url(grant_id, ttl=60)

    client = app.test_client()
    link = client.post("/scan")
    assert link.status_code == 200, link.data
    monkeypatch.undo()
    downloaded = client.get(link.get_data(as_text=True))
    assert downloaded.status_code == 200 and downloaded.data == b"scan"
    assert key_folders(tmp_path) == [tmp_path / "clinic" / "instance" / "cronbox" / "keys"]
    assert list(away.iterdir()) == []


def test_cronbox_storage_needs_an_app_it_is_set_up_on(runtime, tmp_path):
    app, cronbox = host_app(runtime, tmp_path / "clinic", "clinic")
    with pytest.raises(RuntimeError, match=r"cronbox.storage needs an app context"):
        _ = cronbox.storage
    with Flask("other").app_context(), pytest.raises(RuntimeError, match=r"cronbox.storage needs an app context"):
        _ = cronbox.storage
    with app.app_context():
        assert isinstance(cronbox.storage, Storage)
    other, _other_cronbox = host_app(runtime, tmp_path / "other", "other")
    with other.app_context(), pytest.raises(RuntimeError, match=r"cronbox.storage needs an app context"):
        _ = cronbox.storage  # another Cronbox object's app: not this one's to hand out


@pytest.mark.parametrize("name", ["put", "grant", "revoke", "signed_url", "open_file"])
def test_cronbox_storage_takes_the_module_level_calls_arguments(name):
    """`cronbox.storage.grant(...)` and `storage.grant(...)` are the same call: a snippet written for one
    runs on the other."""
    module_level = inspect.signature(getattr(storage, name)).parameters
    method = inspect.signature(getattr(Storage, name)).parameters
    for parameter in module_level.values():
        assert parameter.name in method and method[parameter.name].kind == parameter.kind, parameter
        assert method[parameter.name].default == parameter.default, parameter


def test_a_host_route_checks_the_owner_and_names_who_asked_in_the_audit(runtime, tmp_path):
    """What examples/clinic's link route does with public names only: `owner()` before granting (None
    for no such file, or a malformed id), and `request_client()` as the client of the audited link:
    the proxy's X-Forwarded-For as far as CRONBOX_TRUSTED_PROXIES trusts it, and the User-Agent."""
    from flask import abort, jsonify
    from sqlalchemy import select

    from cronbox import request_client
    from cronbox.storage.models import AuditEntry

    app, cronbox = host_app(runtime, tmp_path / "host", "host", CRONBOX_TRUSTED_PROXIES="1")

    @app.post("/patients/<int:patient>/files/<file_id>/link")
    def link(patient: int, file_id: str):
        with runtime.sessions.begin() as session:
            if cronbox.storage.owner(session, file_id) != f"patient:{patient}":
                abort(404)
            grant = cronbox.storage.grant(session, file_id, f"patient:{patient}")
            url = cronbox.storage.signed_url(grant, session=session, client=request_client())
        return jsonify(url=url)

    with runtime.sessions.begin() as session, app.app_context():
        file_id = cronbox.storage.put(session, io.BytesIO(b"scan"), filename="s.pdf", content_type="application/pdf",
                                      owner="patient:7")
    client = app.test_client()
    headers = {"X-Forwarded-For": "203.0.113.9, 198.51.100.1", "User-Agent": "clinic-desk/1.0"}
    assert client.post(f"/patients/8/files/{file_id}/link", headers=headers).status_code == 404
    assert client.post("/patients/7/files/not-an-id/link", headers=headers).status_code == 404
    assert client.post(f"/patients/7/files/{'0' * 32}/link", headers=headers).status_code == 404
    assert client.post(f"/patients/7/files/{file_id}/link", headers=headers).status_code == 200
    with runtime.sessions() as session:
        issued = session.scalars(select(AuditEntry).where(AuditEntry.action == "issue")).all()
    assert [(e.client_ip, e.user_agent) for e in issued] == [("198.51.100.1", "clinic-desk/1.0")]
