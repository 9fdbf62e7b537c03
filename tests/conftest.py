"""Fixtures: every database test runs on SQLite, on MariaDB (both claim paths) and on PostgreSQL.

MariaDB tests need TEST_MYSQL_URL (e.g. mysql+pymysql://root:@127.0.0.1/test), PostgreSQL tests
TEST_POSTGRES_URL (e.g. postgresql://postgres@127.0.0.1:5432/postgres). Without it, or with the
server unreachable, they are skipped with the reason shown in the summary (-rs); with
CRONBOX_REQUIRE_MYSQL=1 / CRONBOX_REQUIRE_POSTGRES=1 (as in CI) that is a failure instead. Each
test gets its own database `cronbox_test_<random>`, dropped afterwards: nothing assumes `test` is
empty. On PostgreSQL a test with the `runtime` fixture gets it as a copy of a template database the
real migrations made once per session (CREATE DATABASE ... TEMPLATE), dropped at the session's end.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from cronbox.outbox.core import sealing
from cronbox.outbox.core.migrate import upgrade
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.engine.registry import Registry

APP_ROOT = Path(__file__).resolve().parent.parent
MYSQL_URL = os.environ.get("TEST_MYSQL_URL")
REQUIRE_MYSQL = os.environ.get("CRONBOX_REQUIRE_MYSQL") == "1"
POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL")
REQUIRE_POSTGRES = os.environ.get("CRONBOX_REQUIRE_POSTGRES") == "1"

BACKENDS = ["sqlite", "mysql-skip-locked", "mysql-token", "postgresql"]
MYSQL_BACKENDS = ["mysql-skip-locked", "mysql-token"]
# For modules where MariaDB's claim mode changes nothing: each backend once.
ONE_MYSQL_MODE = ["sqlite", "mysql-skip-locked", "postgresql"]

hypothesis_settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
hypothesis_settings.register_profile("dev", deadline=None)
hypothesis_settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _unavailable(reason: str):
    if REQUIRE_MYSQL:
        pytest.fail(f"MariaDB required (CRONBOX_REQUIRE_MYSQL=1) but {reason}")
    pytest.skip(f"MariaDB tests skipped: {reason}")


def _postgres_unavailable(reason: str):
    if REQUIRE_POSTGRES:
        pytest.fail(f"PostgreSQL required (CRONBOX_REQUIRE_POSTGRES=1) but {reason}")
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


@pytest.fixture(scope="session")
def postgres_admin():
    """A server-level engine (autocommit: CREATE/DROP DATABASE) for the test databases."""
    if not POSTGRES_URL:
        _postgres_unavailable("TEST_POSTGRES_URL is not set")
    from cronbox.outbox.core.engines import engine_url

    engine = _reachable(engine_url(POSTGRES_URL), _postgres_unavailable, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def _reachable(url: str, unavailable, **engine_args):
    """A server-level engine on `url` that answered a SELECT 1; else `unavailable(reason)`."""
    engine = create_engine(url, poolclass=NullPool, **engine_args)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        unavailable(f"{make_url(url).render_as_string(hide_password=True)} unreachable: {exc}")
    return engine


def postgres_url(name: str) -> str:
    from cronbox.outbox.core.engines import engine_url

    return make_url(engine_url(POSTGRES_URL)).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_template(postgres_admin, tmp_path_factory) -> str:
    """A database the real migrations made once per session (per xdist worker); tests copy it."""
    name = f"cronbox_tmpl_{secrets.token_hex(6)}"
    with postgres_admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name}"))
    try:
        settings = load_settings(environ={"DATABASE_URL": postgres_url(name), "CRONBOX_HANDLERS": "",
                                          "CRONBOX_INSTANCE": str(tmp_path_factory.mktemp("schema-template"))})
        rt = Runtime(settings)
        upgrade(settings, rt.engine)
        rt.dispose()
        yield name
    finally:
        with postgres_admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(scope="session")
def mysql_admin():
    """A server-level engine for creating and dropping test databases."""
    if not MYSQL_URL:
        _unavailable("TEST_MYSQL_URL is not set")
    engine = _reachable(MYSQL_URL, _unavailable, connect_args={"ssl_disabled": True})
    yield engine
    engine.dispose()


@dataclass
class Database:
    backend: str
    url: str
    claim_mode: str
    name: str | None = None
    migrated: bool = False  # made as a copy of the session's migrated template (PostgreSQL)

    @property
    def is_mysql(self) -> bool:
        return self.backend.startswith("mysql")

    @property
    def is_postgresql(self) -> bool:
        return self.backend == "postgresql"

    @property
    def is_server(self) -> bool:
        return self.backend != "sqlite"


def pytest_generate_tests(metafunc):
    """Every test using a database runs on each backend in BACKENDS, or on those its closest
    `@pytest.mark.backends(...)` names (a module's `pytestmark`, or the test's own): modules whose
    tests the claim mode cannot change run MariaDB once (skip-locked), not twice."""
    if "backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("backends")
    metafunc.parametrize("backend", list(marker.args) if marker else BACKENDS, indirect=True)


# The suite's longest tests (minutes of one worker each: the example app's own suite per backend, the
# chaos runs), collected first. `--dist worksteal` (pytest.ini) hands each worker a contiguous share of the
# collection and lets idle workers take unstarted tests from the end of another's: the first worker
# starts these at once and the others take the rest of its share, where in collection order one of them
# could start last and end the run alone (CI's 30 minutes).
RUN_FIRST = ("tests/processes/test_example_app.py::",
             "tests/processes/test_broker_jobs_processes.py::test_thousands_of_jobs",
             "tests/processes/test_batch_chaos.py::")


def pytest_collection_modifyitems(config, items):
    """The longest tests first, in RUN_FIRST's order; every other test keeps its place (a stable sort)."""
    def rank(item) -> int:
        return next((i for i, prefix in enumerate(RUN_FIRST) if item.nodeid.startswith(prefix)), len(RUN_FIRST))

    items.sort(key=rank)


@pytest.fixture
def backend(request):
    """Set by pytest_generate_tests from the backends marker."""
    return request.param


class ServerSettingsLock:
    """Tests run in parallel (pytest-xdist) against one MariaDB server. A test that changes a server
    setting (`SET GLOBAL wait_timeout = 2`) would break the connections of tests running beside it,
    so every MariaDB test holds this lock shared, and such a test holds it exclusive: a reader-writer
    lock across the worker processes, on a file they share (flock; one descriptor per process, so
    the exclusive holder converts its own shared lock)."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def shared(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_SH)

    def exclusive(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def server_settings_lock() -> ServerSettingsLock:
    """One lock per MariaDB server on this machine, not per test run: two test runs side by side (two
    checkouts, or a run beside CI) share the server, and a run's `SET GLOBAL wait_timeout = 2` timed out
    an idle connection of the other's (a host app's request, "Got timeout reading communication packets")."""
    url = make_url(os.environ.get("TEST_MYSQL_URL") or "mysql://127.0.0.1")
    server = hashlib.sha256(f"{url.host}:{url.port or 3306}".encode()).hexdigest()[:12]
    return ServerSettingsLock(Path(tempfile.gettempdir()) / f"cronbox-mariadb-server-settings-{server}.lock")


@pytest.fixture
def database(backend, tmp_path, request):
    if backend == "sqlite":
        yield Database(backend, f"sqlite:///{tmp_path / 'instance' / 'cronbox.db'}", "auto")
        return
    if backend == "postgresql":
        admin = request.getfixturevalue("postgres_admin")
        name = f"cronbox_test_{secrets.token_hex(6)}"
        # A test that has the `runtime` fixture gets the migrated schema: its database is made a copy of
        # the template at once, not made empty, dropped and made again (two copies of template1's
        # catalogue a test: the PostgreSQL tests' setup, on a CPU-bound CI run).
        migrated = "runtime" in request.fixturenames
        template = f" TEMPLATE {request.getfixturevalue('postgres_template')}" if migrated else ""
        with admin.connect() as connection:
            connection.execute(text(f"CREATE DATABASE {name}{template}"))
        try:
            yield Database(backend, postgres_url(name), "auto", name, migrated=migrated)
        finally:
            with admin.connect() as connection:
                connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        return
    admin = request.getfixturevalue("mysql_admin")
    lock = request.getfixturevalue("server_settings_lock")
    lock.shared()
    request.addfinalizer(lock.release)
    name = f"cronbox_test_{secrets.token_hex(6)}"
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name} CHARACTER SET utf8mb4"))
    url = make_url(MYSQL_URL).set(database=name).render_as_string(hide_password=False)
    try:
        yield Database(backend, url, backend.removeprefix("mysql-"), name)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {name}"))


@pytest.fixture
def env(database, tmp_path) -> dict[str, str]:
    """Settings for this test as environment variables (also handed to subprocesses)."""
    return {
        "DATABASE_URL": database.url,
        "CRONBOX_INSTANCE": str(tmp_path / "instance"),
        "CRONBOX_CLAIM_MODE": database.claim_mode,
        "CRONBOX_LEASE_MARGIN": "0",
        "CRONBOX_HANDLERS": "",
    }


@pytest.fixture
def settings(env):
    return load_settings(environ=env)


@pytest.fixture
def registry():
    return Registry()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """A SQLite database migrated once per session by the real migrations; tests copy it."""
    folder = tmp_path_factory.mktemp("schema-template")
    settings = load_settings(environ={"DATABASE_URL": f"sqlite:///{folder / 'cronbox.db'}",
                                      "CRONBOX_INSTANCE": str(folder), "CRONBOX_HANDLERS": ""})
    rt = Runtime(settings)
    upgrade(settings, rt.engine)
    rt.dispose()
    return folder / "cronbox.db"


@pytest.fixture(scope="session")
def mysql_template(mysql_admin, tmp_path_factory) -> list[str]:
    """The statements that recreate the schema the real migrations made once per session on MariaDB:
    each table's SHOW CREATE TABLE (indexes, foreign keys and all) and the Alembic version row."""
    name = f"cronbox_tmpl_{secrets.token_hex(6)}"
    with mysql_admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE {name} CHARACTER SET utf8mb4"))
    try:
        url = make_url(MYSQL_URL).set(database=name).render_as_string(hide_password=False)
        settings = load_settings(environ={"DATABASE_URL": url, "CRONBOX_HANDLERS": "",
                                          "CRONBOX_INSTANCE": str(tmp_path_factory.mktemp("schema-template"))})
        rt = Runtime(settings)
        upgrade(settings, rt.engine)
        with rt.engine.connect() as connection:
            tables = [row[0] for row in connection.execute(text("SHOW TABLES"))]
            statements = [connection.execute(text(f"SHOW CREATE TABLE `{t}`")).one()[1] for t in tables]
            versions = [row[0] for row in connection.execute(text("SELECT version_num FROM cronbox_alembic_version"))]
            installs = connection.execute(text("SELECT install_id FROM cronbox_install")).all()  # migration 0014's row
        rt.dispose()
    finally:
        with mysql_admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {name}"))
    return (statements + [f"INSERT INTO cronbox_alembic_version (version_num) VALUES ('{v}')" for v in versions]
            + [f"INSERT INTO cronbox_install (id, install_id, created_at) VALUES (1, '{i}', UTC_TIMESTAMP(6))"
               for (i,) in installs])


@pytest.fixture
def runtime(settings, registry, database, request):
    """A runtime on this test's fresh database, with the schema of the migrations' head.

    The schema is copied from a per-session template the real migrations made (test_migrations.py
    runs them on each backend too): Alembic on every test cost about 0.6 s a test on MariaDB.
    """
    if database.is_postgresql:
        if not database.migrated:
            # Asked for late (getfixturevalue): the empty database made again as a copy of the template
            # (nothing has connected to it yet).
            template = request.getfixturevalue("postgres_template")
            with request.getfixturevalue("postgres_admin").connect() as connection:
                connection.execute(text(f"DROP DATABASE {database.name}"))
                connection.execute(text(f"CREATE DATABASE {database.name} TEMPLATE {template}"))
        rt = Runtime(settings, registry=registry)
    elif database.is_mysql:
        rt = Runtime(settings, registry=registry)
        with rt.engine.begin() as connection:
            connection.execute(text("SET FOREIGN_KEY_CHECKS = 0"))
            for statement in request.getfixturevalue("mysql_template"):
                connection.execute(text(statement))
            connection.execute(text("SET FOREIGN_KEY_CHECKS = 1"))
    else:
        settings.private_dir()  # the instance folder, 0700, where this test's database file goes
        source = sqlite3.connect(request.getfixturevalue("sqlite_template"))
        copy = sqlite3.connect(make_url(database.url).database)
        try:
            source.backup(copy)
        finally:
            source.close()
            copy.close()
        rt = Runtime(settings, registry=registry)
    # Sealed payloads (the channel jobs are sealed) under this test's own key folder, never the checkout's
    # standalone one: the same sealer seals in the test's process and opens in its workers.
    from cronbox.storage.payload_keys import sealer_of

    sealer = sealer_of(settings)
    rt.sealer_source = lambda: sealer
    with sealing.using(sealer):
        yield rt
    rt.dispose()


def thorough(examples: int) -> int:
    """A property test's example count: all of them in CI (CI=1), a quarter in the edit loop
    (`pytest tests/units`, which stays under half a minute); the property is the same."""
    return examples if os.environ.get("CI") else max(25, examples // 4)


def child_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    """Environment for a cronbox subprocess: nothing of ours leaks in but what the test sets."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")}
    return {**keep, **env, "PYTHONPATH": str(APP_ROOT), **extra}


def run_cli(env: dict[str, str], *args: str, cwd: Path | None = None, timeout: float = 120,
            input_text: str | None = None, **extra: str):
    """Run `python -m cronbox ARGS` as cron would: another working directory, our settings only."""
    return subprocess.run(
        [sys.executable, "-m", "cronbox", *args],
        env=child_env(env, **extra), cwd=str(cwd or Path("/")), capture_output=True, text=True, timeout=timeout,
        input=input_text if input_text is not None else "",
    )


def start_cli(env: dict[str, str], *args: str, cwd: Path | None = None, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cronbox", *args],
        env=child_env(env, **extra), cwd=str(cwd or Path("/")), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="session")
def installed_venv() -> Path:
    """The python of a virtualenv outside the checkout with cronbox pip-installed from it, shared by
    the xdist workers and later sessions while the sources do not change (tests/package_helpers.py)."""
    from tests.package_helpers import installed_build

    return installed_build().python


from tests.rabbit import amqp_vhost, rabbit  # noqa: E402,F401  (the RabbitMQ fixtures)
