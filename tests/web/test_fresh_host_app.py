"""A fresh host app (Flask-SQLAlchemy, cronbox as an extension, no `migrate` run) whose very first request is
an upload (issue 35, items 7 and 8).

Item 7: the host's SQLite file, made 0644 by Flask-SQLAlchemy, stayed 0644 (and its -wal/-shm with it) in
a web-only set-up until someone ran `migrate`, although SQLite migrates itself there: the self-migration now
narrows them as `migrate` does. Item 8: the sealed storage was built on the runtime before its schema check,
so a first request that was a host's `seal_upload` sealed the file, then failed on "no such table" (a 500
and an orphan sealed file). Now nothing is sealed before the schema is checked: on SQLite the request
succeeds; on a server database nobody migrated it is refused with nothing left on disk.
"""
from __future__ import annotations

import stat

import pytest
from flask import Flask, jsonify
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import func, select

from cronbox import Cronbox, seal_upload, sealed_upload_route
from cronbox.outbox.core import sqlite_files
from cronbox.storage.models import SealedFile
from tests.storage_helpers import files_under
from tests.web.test_extension import Base, Payment, host_root  # noqa: F401  (host_root: the fixture)

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

UPLOAD_TOKEN = "an-upload-token-for-scripts"


def clinic(root, database, tmp_path) -> tuple[Flask, SQLAlchemy]:
    """The host's factory: its own tables made by Flask-SQLAlchemy, cronbox set up, one upload route."""
    app = Flask("clinic", root_path=str(root), instance_path=str(root / "instance"))
    app.config.update(CRONBOX_HANDLERS="", CRONBOX_UPLOAD_TOKEN=UPLOAD_TOKEN, SECRET_KEY="the clinic's",
                      SQLALCHEMY_DATABASE_URI="sqlite:///clinic.db" if not database.is_server else database.url)
    db = SQLAlchemy(model_class=Base)
    db.init_app(app)
    with app.app_context():
        db.create_all()  # the host's own tables (clinic_payments), as its factory or `flask db upgrade` makes them
    Cronbox().init_app(app, db=db)

    @app.post("/patients/<int:patient>/scans")
    @sealed_upload_route
    def upload_scan(patient: int):
        upload = seal_upload(session=db.session, owner=f"patient:{patient}")
        db.session.add(Payment(amount=1))  # the host's own row, in the same transaction
        db.session.commit()
        return jsonify(id=upload.file_id), 201

    return app, db


def upload_first(app, how: str):
    client = app.test_client()
    if how == "POST /files":
        return client.post("/files", data=b"%PDF-1.7 a scan", content_type="application/pdf",
                           headers={"Authorization": f"Bearer {UPLOAD_TOKEN}", "X-Cronbox-Owner": "patient:1"})
    return client.post("/patients/1/scans", data=b"%PDF-1.7 a scan", content_type="application/pdf",
                       headers={"X-Cronbox-Filename": "scan.pdf"})


def sealed_rows(app, db) -> int:
    with app.app_context():
        return db.session.scalar(select(func.count()).select_from(SealedFile))


def close(app, db) -> None:
    app.extensions["cronbox"].runtime.dispose()
    with app.app_context():
        db.engine.dispose()


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("how", ["POST /files", "seal_upload"])
def test_the_first_request_an_upload_migrates_and_makes_the_database_private(how, host_root, database, tmp_path):
    app, db = clinic(host_root, database, tmp_path)
    database_file = host_root / "instance" / "clinic.db"
    database_file.chmod(0o644)  # as Flask-SQLAlchemy makes it under the usual umask
    try:
        answer = upload_first(app, how)
        assert answer.status_code == 201, answer.get_data(as_text=True)
        files = sqlite_files.files_of(database_file)
        assert {path.name for path in files} >= {"clinic.db", "clinic.db-wal", "clinic.db-shm"}
        assert {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in files} == {
            path.name: "0o600" for path in files}
        sealed = list(files_under(app.extensions["cronbox"].settings.sealed_dir))
        assert len(sealed) == sealed_rows(app, db) == 1  # no orphan
        with app.app_context():
            assert db.session.scalar(select(func.count()).select_from(Payment)) == (1 if how == "seal_upload" else 0)
    finally:
        close(app, db)


@pytest.mark.backends("mysql-skip-locked", "postgresql")
def test_a_first_seal_upload_on_an_unmigrated_server_database_seals_nothing(host_root, database, tmp_path):
    """MySQL and PostgreSQL are migrated on purpose: until then, a host's upload is refused before a byte is
    sealed, never a file left on disk without its row."""
    app, db = clinic(host_root, database, tmp_path)
    app.testing = False
    try:
        answer = upload_first(app, "seal_upload")
        assert answer.status_code == 500
        assert list(files_under(app.extensions["cronbox"].settings.sealed_dir)) == []
    finally:
        close(app, db)
