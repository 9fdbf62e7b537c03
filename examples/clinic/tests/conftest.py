"""The clinic's tests: its routes through Flask's test client, what follows a payment through cronbox's
test kit (the `cronbox_kit` and `cronbox_inline` fixtures of cronbox's pytest plugin, on the app
`cronbox_app` returns), its cron line as a real `python -m cronbox` subprocess, on SQLite and (with
TEST_MYSQL_URL, TEST_POSTGRES_URL) on MariaDB and PostgreSQL, each in a database of their own.

They run against whichever cronbox is importable: the installed package (as a user has it), or the
checkout with PYTHONPATH=<checkout> for quick runs. Settings go in through the environment, as a
deployment's .env would put them: the cron subprocess builds the same app from them.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

EXAMPLE_ROOT = Path(__file__).resolve().parent.parent
MYSQL_URL = os.environ.get("TEST_MYSQL_URL")
POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL")
STAFF_TOKEN = "staff-" + "x" * 32
STAFF = {"Authorization": f"Bearer {STAFF_TOKEN}"}
PHONE = "+989121234567"
EMAIL = "sara@example.org"


@pytest.fixture(params=["sqlite", "mysql", "postgresql"])
def database_url(request, tmp_path):
    """SQLite in the test's folder, or a fresh `cronbox_test_<random>` MariaDB or PostgreSQL database
    dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'clinic.db'}"
        return
    if request.param == "postgresql":
        yield from postgres_database()
        return
    if not MYSQL_URL:
        if os.environ.get("CRONBOX_REQUIRE_MYSQL") == "1":
            pytest.fail("MariaDB required (CRONBOX_REQUIRE_MYSQL=1) but TEST_MYSQL_URL is not set")
        pytest.skip("MariaDB tests skipped: TEST_MYSQL_URL is not set")
    admin = create_engine(MYSQL_URL, poolclass=NullPool)
    name = f"cronbox_test_{secrets.token_hex(6)}"
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"))
    try:
        yield make_url(MYSQL_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


@pytest.fixture
def instance(tmp_path) -> Path:
    return tmp_path / "instance"


@pytest.fixture
def clinic_env(monkeypatch, tmp_path, database_url, instance):
    """The deployment's settings, in the environment of this process and of the cron subprocesses."""
    values = {
        "DATABASE_URL": database_url,
        "CLINIC_NAME": "Example Clinic",
        "CLINIC_STAFF_TOKEN": STAFF_TOKEN,
        "CRONBOX_APP": "clinic:create_app",
        "CRONBOX_APP_ROOT": str(EXAMPLE_ROOT),
        "CRONBOX_INSTANCE": str(instance),
        "CRONBOX_SMS_DRIVER": "log",
        "CRONBOX_MAIL_DRIVER": "log",
        "CRONBOX_BASE_URL": "https://clinic.example",
        "CRONBOX_UPLOAD_MAX": "6M",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def cron(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m cronbox ARGS` as the cron line runs it: another process, started from an unrelated folder."""
    env = dict(os.environ)
    if env.get("PYTHONPATH"):  # quick runs from the checkout: keep it valid from another folder
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return subprocess.run([sys.executable, "-m", "cronbox", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def run_cron(clinic_env, tmp_path):
    home = tmp_path / "home"  # cron starts in $HOME, not in the app
    home.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess:
        done = cron(home, *args)
        assert done.returncode == 0, f"cron {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        return done

    return run


def upgrade_clinic() -> None:
    """`alembic upgrade head` with the clinic's alembic.ini, in this process (its logging left alone)."""
    from alembic import command
    from alembic.config import Config

    config = Config(str(EXAMPLE_ROOT / "alembic.ini"))
    config.attributes["configure_logger"] = False
    command.upgrade(config, "head")


@pytest.fixture
def migrated(clinic_env, run_cron):
    """cronbox's tables by `python -m cronbox migrate` (a cron line), the clinic's by its own Alembic."""
    run_cron("migrate")
    upgrade_clinic()


@pytest.fixture
def make_app(migrated):
    from clinic import create_app
    from clinic.models import db

    apps = []

    def make(config: dict | None = None, *, app=None):
        """A new clinic app (or `app`, built elsewhere), closed after the test."""
        app = app or create_app({"TESTING": True, **(config or {})})
        apps.append(app)
        return app

    yield make
    for app in apps:  # every connection closed, so a MariaDB database can be dropped
        with app.app_context():
            for engine in db.engines.values():
                engine.dispose()
        runtime = app.extensions["cronbox"]._runtime
        if runtime is not None:
            runtime.dispose()


# The in-process app's SMS and e-mail go to cronbox's test driver: the kit shows them (cronbox_kit.outbox).
# The cron subprocesses build the app from the environment above: the log drivers there.
TEST_DRIVERS = {"CRONBOX_SMS_DRIVER": "test", "CRONBOX_MAIL_DRIVER": "test"}


@pytest.fixture
def app(make_app):
    return make_app(TEST_DRIVERS)


@pytest.fixture
def cronbox_app(app):
    """The app cronbox's test kit runs the clinic's handlers in (cronbox's pytest plugin asks for it)."""
    return app


@pytest.fixture
def booked(app):
    """A patient with an appointment of 120.00 not paid yet: (patient id, appointment id)."""
    from clinic.models import Appointment, Patient, db

    with app.app_context():
        patient = Patient(name="Sara Ahmadi", phone=PHONE, email=EMAIL)
        db.session.add(patient)
        db.session.flush()
        appointment = Appointment(patient_id=patient.id, starts_at=datetime(2026, 12, 3, 9, 30), fee=Decimal("120.00"))
        db.session.add(appointment)
        db.session.commit()
        return patient.id, appointment.id


def postgres_database():
    """A fresh PostgreSQL database; the clinic's URL names psycopg 3 (`postgresql+psycopg://`), the
    driver `cronbox[postgresql]` brings, for its own engine too."""
    if not POSTGRES_URL:
        if os.environ.get("CRONBOX_REQUIRE_POSTGRES") == "1":
            pytest.fail("PostgreSQL required (CRONBOX_REQUIRE_POSTGRES=1) but TEST_POSTGRES_URL is not set")
        pytest.skip("PostgreSQL tests skipped: TEST_POSTGRES_URL is not set")
    server = make_url(POSTGRES_URL).set(drivername="postgresql+psycopg")
    admin = create_engine(server, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    name = f"cronbox_test_{secrets.token_hex(6)}"
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
