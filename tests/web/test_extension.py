"""Cronbox().init_app in a host app: where its settings, database and instance folder come from, and
how each part is switched off or moved, without the host's own routes noticing."""
from __future__ import annotations

import io
import json
import os

import pytest
from flask import Flask, jsonify
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import cronbox
from cronbox import Cronbox
from cronbox.web.state import state
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.migrate import upgrade
from cronbox.outbox.events.models import OutboxEvent

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")


class Base(DeclarativeBase):
    pass


class Payment(Base):
    __tablename__ = "clinic_payments"
    id: Mapped[int] = mapped_column(primary_key=True)
    amount: Mapped[int]


@pytest.fixture
def host_root(tmp_path, monkeypatch):
    """A host app's folder, with none of the test's environment leaking into it."""
    for name in list(os.environ):
        if name.startswith("CRONBOX_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    root = tmp_path / "clinic_root"
    root.mkdir()
    return root


def host_app(root, database_url: str | None = None, **config) -> tuple[Flask, SQLAlchemy | None]:
    app = Flask("clinic", root_path=str(root), instance_path=str(root / "instance"))
    app.config.update(CRONBOX_HANDLERS="", CRONBOX_LEASE_MARGIN="0", **config)

    @app.errorhandler(404)
    def json_404(error):
        return jsonify(error="not found"), 404

    @app.get("/patients")
    def patients():
        return jsonify([])

    db = None
    if database_url:
        db = SQLAlchemy(model_class=Base)
        app.config["SQLALCHEMY_DATABASE_URI"] = database_url
        db.init_app(app)
    return app, db


def test_settings_come_from_app_config_then_env_then_dotenv(host_root, monkeypatch):
    (host_root / ".env").write_text("CRONBOX_CRON_INTERVAL=3\nCRONBOX_LEASE_MARGIN=7\nCRONBOX_POOL_RECYCLE=9\n")
    monkeypatch.setenv("CRONBOX_LEASE_MARGIN", "8")
    monkeypatch.setenv("CRONBOX_POOL_RECYCLE", "10")
    app, _ = host_app(host_root)
    app.config["CRONBOX_POOL_RECYCLE"] = 11
    app.config.pop("CRONBOX_LEASE_MARGIN")
    settings = Cronbox().init_app(app).settings
    assert (settings.cron_interval, settings.lease_margin, settings.pool_recycle) == (3, 8.0, 11)
    assert settings.app_root == host_root.resolve()


def test_the_instance_folder_is_the_hosts_cronbox_subfolder_and_nothing_else_is_written(host_root):
    app, _ = host_app(host_root)
    st = Cronbox().init_app(app)
    assert st.settings.instance == (host_root / "instance" / "cronbox").resolve()
    with app.test_client() as client:
        assert client.get("/health").status_code in (200, 503)
    written = {p.relative_to(host_root).parts[:2] for p in host_root.rglob("*")}
    assert written <= {("instance",), ("instance", "cronbox")}, written
    assert oct((host_root / "instance" / "cronbox").stat().st_mode & 0o777) == "0o700"
    st.runtime.dispose()


def test_an_explicit_instance_wins(host_root, tmp_path):
    app, _ = host_app(host_root, CRONBOX_INSTANCE=str(tmp_path / "elsewhere"))
    assert Cronbox().init_app(app).settings.instance == (tmp_path / "elsewhere").resolve()


def test_the_database_is_the_hosts_so_an_event_commits_with_the_business_row(host_root, database):
    url = "sqlite:///clinic.db"  # relative: Flask-SQLAlchemy's instance folder
    if database.is_server:  # on PostgreSQL the host's own driver is psycopg2; cronbox's engines use psycopg 3
        url = database.url.replace("postgresql+psycopg:", "postgresql+psycopg2:")
    app, db = host_app(host_root, url)
    st = Cronbox().init_app(app, db=db)
    with app.app_context():
        host_url = db.engine.url.render_as_string(hide_password=False)
        assert st.settings.database_url == host_url
        if database.is_postgresql:
            assert db.engine.dialect.driver == "psycopg2" and st.runtime.engine.dialect.driver == "psycopg"
        if not database.is_server:
            assert host_url.endswith(str(host_root / "instance" / "clinic.db"))
        upgrade(st.settings, st.runtime.engine)  # `cron migrate` (MariaDB is never migrated on first use)
        db.create_all()
        db.session.add(Payment(amount=50))
        cronbox.record(db.session, "appointment.paid", {"appointment": 1})
        db.session.rollback()  # the payment failed: no event either
        db.session.add(Payment(amount=70))
        cronbox.record(db.session, "appointment.paid", {"appointment": 2})
        db.session.commit()
    with st.runtime.sessions() as session:
        events = session.scalars(select(OutboxEvent.payload)).all()
    assert [json.loads(e)["appointment"] if isinstance(e, str) else e["appointment"] for e in events] == [2]
    st.runtime.dispose()


def test_cronbox_database_url_wins_over_the_hosts(host_root, tmp_path):
    other = f"sqlite:///{tmp_path / 'other.db'}"
    app, db = host_app(host_root, "sqlite:///clinic.db", CRONBOX_DATABASE_URL=other)
    assert Cronbox().init_app(app, db=db).settings.database_url == other


def test_init_app_needs_db_initialised_first_and_runs_once(host_root):
    app = Flask("clinic", root_path=str(host_root))
    app.config["CRONBOX_HANDLERS"] = ""
    with pytest.raises(RuntimeError, match="db.init_app"):
        Cronbox().init_app(app, db=SQLAlchemy())
    app2, _ = host_app(host_root)
    Cronbox().init_app(app2)
    with pytest.raises(RuntimeError, match="already"):
        Cronbox().init_app(app2)


def test_without_init_app_the_helpers_say_so(host_root):
    app, _ = host_app(host_root)
    with app.app_context(), pytest.raises(RuntimeError, match="init_app"):
        state()


def test_parts_switch_off_and_the_hosts_404_answers(host_root):
    app, _ = host_app(host_root, CRONBOX_HEALTH="off", CRONBOX_FILES=False, CRONBOX_OPS="off",
                      CRONBOX_WEBCRON="off", CRONBOX_CRON_TOKEN="t" * 32)
    Cronbox().init_app(app)
    client = app.test_client()
    for path in ("/health", "/files/abc", "/ops/", "/ops/login"):
        response = client.get(path)
        assert response.status_code == 404 and response.get_json() == {"error": "not found"}, path
    assert client.post("/cron/tick", headers={"Authorization": "Bearer " + "t" * 32}).status_code == 404
    assert client.get("/patients").get_json() == []


def test_parts_move_to_their_prefixes(host_root):
    app, _ = host_app(host_root, CRONBOX_HEALTH_PREFIX="/cb", CRONBOX_FILES_PREFIX="/clinic/",
                      CRONBOX_OPS_PREFIX="/admin")
    st = Cronbox().init_app(app)
    client = app.test_client()
    assert client.get("/cb/health").status_code in (200, 503)
    assert client.get("/health").get_json() == {"error": "not found"}
    console = client.get("/admin/ops/login")  # the login page, or the first-run page when no password is set
    assert console.status_code == 200 or console.headers["Location"].startswith("/admin/ops/"), console.headers
    assert client.get("/ops/login").get_json() == {"error": "not found"}
    # a route miss under the moved /files is ours (with its headers); the old place is the host's
    moved = client.get("/clinic/files/nope/x")
    assert moved.status_code == 404 and moved.headers["Cache-Control"] == "no-store"
    assert client.get("/files/nope").get_json() == {"error": "not found"}
    assert client.get("/nowhere").get_json() == {"error": "not found"}
    st.runtime.dispose()


def test_signed_links_follow_the_files_prefix_and_download(host_root):
    app, _ = host_app(host_root, CRONBOX_FILES_PREFIX="/clinic", CRONBOX_BASE_URL="https://clinic.example/app")
    st = Cronbox().init_app(app)
    rt = st.runtime
    upgrade(st.settings, rt.engine)
    store = st.storage
    with rt.sessions.begin() as session:
        file_id = store.put(session, io.BytesIO(b"scan"), filename="scan.pdf", content_type="application/pdf",
                            owner="patient:1")
        grant_id = store.grant(session, file_id, "patient:1")
    relative = store.signed_url(grant_id)
    absolute = store.signed_url(grant_id, absolute=True)
    assert relative.startswith("/clinic/files/")
    assert absolute.startswith("https://clinic.example/app/clinic/files/")
    response = app.test_client().get(relative)
    assert response.status_code == 200 and response.data == b"scan"
    rt.dispose()


@pytest.mark.parametrize("name, value", [
    ("CRONBOX_HEALTH", "maybe"), ("CRONBOX_OPS_PREFIX", "/a b"), ("CRONBOX_FILES_PREFIX", "/x?y"),
    ("CRONBOX_WEBCRON_PREFIX", "/../x"),
])
def test_bad_part_settings_are_one_line_errors(host_root, name, value):
    app, _ = host_app(host_root, **{name: value})
    with pytest.raises(SettingsError, match=name):
        Cronbox().init_app(app)


def test_a_forked_pool_child_drops_the_host_apps_pooled_connections_too(host_root):
    """A handler may use the host's own engine (db.engine): a worker pool's child must not reuse the
    connection the parent left in that pool, and must leave it to the parent, open."""
    from tests.db.test_fork_connections import in_forked_child, mark, state_of

    app, db = host_app(host_root, "sqlite:///clinic.db")
    st = Cronbox().init_app(app, db=db)
    runtime = st.runtime
    try:
        with app.app_context():
            engine = db.engine
        mark(engine, is_mysql=False)
        parent = state_of(engine, is_mysql=False)
        assert parent["marker"] is not None

        def child():
            kept = engine.pool  # noqa: F841  (the parent's pool stays alive here)
            runtime.drop_inherited_connections()
            return state_of(engine, is_mysql=False)

        assert in_forked_child(child)["marker"] is None  # a connection of its own
        assert state_of(engine, is_mysql=False) == parent  # the parent's, open, as it was
    finally:
        runtime.dispose()
