"""A SQLite database open to other accounts (issue 24): a host app's file made 0644 in a 0755 folder by
Flask-SQLAlchemy holds cronbox's job payloads in clear. /health (with the token) and `health` fail
naming the file or folder and the fix, never a byte of it; `migrate` narrows the database file and its
-wal/-shm/-journal to 0600 when this user owns them, and says so in one line each; another owner's
file is left alone with a warning. The umask is never changed."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import APP_ROOT, child_env, run_cli

pytestmark = pytest.mark.backends("sqlite")  # only SQLite keeps the database in files
HOSTAPP = APP_ROOT / "tests" / "hostapp"
TOKEN = "health-" + "t" * 32
SIDE = ("-wal", "-shm", "-journal")


@pytest.fixture
def usual_umask():
    previous = os.umask(0o022)  # what a shared host's cron and Passenger start with
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def clinic(tmp_path, usual_umask):
    """tests/hostapp's clinic (Flask-SQLAlchemy, `sqlite:///clinic.db` in its instance folder) in an app root."""
    root = tmp_path / "apps" / "clinic"
    shutil.copytree(HOSTAPP, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / ".env").write_text(f"CRONBOX_HEALTH_TOKEN={TOKEN}\nCRONBOX_HANDLERS=\n")
    return root


def host_env(root: Path) -> dict[str, str]:
    env = child_env({"CRONBOX_APP": "clinic:create_app", "CRONBOX_APP_ROOT": str(root)})
    env["PYTHONPATH"] = f"{root}:{APP_ROOT}"
    return env


WEB = """
import json, sys
from clinic import create_app
client = create_app().test_client()
token = {"Authorization": "Bearer %s"}
full, public = client.get("/health", headers=token), client.get("/health")
print(json.dumps([full.status_code, full.json, public.status_code, public.json]))
""" % TOKEN


def web_health(root: Path):
    """The host's web process (its factory, its db.create_all()) answering GET /health."""
    done = subprocess.run([sys.executable, "-c", WEB], cwd=str(root), env=host_env(root), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def host_cron(root: Path, *args: str):
    return subprocess.run([sys.executable, "-m", "cronbox", *args], cwd=str(root.parent), env=host_env(root),
                          capture_output=True, text=True, timeout=120)


def database_check(report: dict) -> dict:
    (check,) = [c for c in report["checks"] if c["name"] == "database_file"]
    return check


def test_a_host_apps_readable_database_fails_health_until_migrate_and_chmod_close_it(clinic):
    database, instance = clinic / "instance" / "clinic.db", clinic / "instance"
    status, report, public_status, public = web_health(clinic)
    assert mode(database) == 0o644 and mode(instance) == 0o755  # as Flask-SQLAlchemy made them
    check = database_check(report)
    assert status == 503 and report["status"] == "fail" and check["status"] == "fail"
    assert f"{database} 0o644" in check["detail"] and f"chmod 600 {database}" in check["detail"]
    assert f"chmod 700 {instance}" in check["detail"]
    assert public_status == 503 and public == {"status": "fail"}  # no names without the token

    migrated = host_cron(clinic, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert f"migrate: {database} was mode 0o644, open to other users: narrowed to 0600" in migrated.stdout
    assert migrated.stderr.strip() == f"warning: {instance} (the database's folder) is open to other users: chmod 700 it"
    assert mode(database) == 0o600 and mode(instance) == 0o755  # the host's folder is the owner's to close
    check = database_check(web_health(clinic)[1])
    assert check["status"] == "fail" and str(database) not in check["detail"] and f"chmod 700 {instance}" in check["detail"]

    instance.chmod(0o700)
    status, report, _, _ = web_health(clinic)
    assert database_check(report) == {"name": "database_file", "status": "ok", "detail": "private", "value": None}
    assert host_cron(clinic, "migrate").stdout.strip().splitlines()[-1].startswith("migrate: already at")


def test_the_standalone_database_is_created_private_and_kept_so(env, usual_umask):
    """cronbox's own database in its instance folder: created 0600, and narrowed again by any command."""
    instance = Path(env["CRONBOX_INSTANCE"])
    database = instance / "cronbox.db"
    assert run_cli(env, "migrate").returncode == 0
    assert mode(database) == 0o600 and mode(instance) == 0o700
    assert database_check(json.loads(run_cli(env, "health", "--json").stdout))["status"] == "ok"
    database.chmod(0o644)
    assert database_check(json.loads(run_cli(env, "health", "--json").stdout))["status"] == "ok"
    assert mode(database) == 0o600
    instance.chmod(0o750)
    check = database_check(json.loads(run_cli(env, "health", "--json").stdout))
    assert check["status"] == "fail" and check["detail"].endswith(f"fix: chmod 700 {instance}")


def test_a_database_outside_the_instance_and_its_side_files_are_narrowed_by_migrate(env, usual_umask, tmp_path):
    """DATABASE_URL naming a file elsewhere (made 0644 by another tool): health names each file, and
    migrate narrows each, one line apiece."""
    folder = tmp_path / "data"
    folder.mkdir(mode=0o700)
    database = folder / "app.db"
    env = {**env, "DATABASE_URL": f"sqlite:///{database}"}
    assert run_cli(env, "migrate").returncode == 0
    assert mode(database) == 0o600  # created by cronbox: private from the start
    database.chmod(0o640)
    for suffix in SIDE:
        side = folder / f"app.db{suffix}"
        if not side.exists():
            side.write_bytes(b"")
        side.chmod(0o604)
    health = run_cli(env, "health", "--json")
    check = database_check(json.loads(health.stdout))
    assert health.returncode == 1 and check["status"] == "fail"
    for suffix in ("", *SIDE):
        assert f"{database}{suffix} 0o6" in check["detail"]
    assert "chmod 700" not in check["detail"]
    migrated = run_cli(env, "migrate")
    assert migrated.returncode == 0 and migrated.stderr == ""
    narrowed = [line for line in migrated.stdout.splitlines() if "narrowed to 0600" in line]
    assert len(narrowed) == 4 and narrowed[0] == f"migrate: {database} was mode 0o640, open to other users: narrowed to 0600"
    left = {p.name: mode(p) for p in folder.glob("app.db*")}  # SQLite removes -wal/-shm at its last close
    assert {"app.db", "app.db-journal"} <= set(left) and set(left.values()) == {0o600}
    assert database_check(json.loads(run_cli(env, "health", "--json").stdout))["status"] == "ok"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_another_owners_file_is_left_as_it_is_with_a_warning(env, usual_umask):
    instance = Path(env["CRONBOX_INSTANCE"])
    assert run_cli(env, "migrate").returncode == 0
    journal = instance / "cronbox.db-journal"
    journal.write_bytes(b"")
    journal.chmod(0o644)
    os.chown(journal, 65534, 65534)
    migrated = run_cli(env, "migrate")
    assert migrated.returncode == 0
    assert migrated.stderr.strip() == (f"warning: {journal} is mode 0o644, open to other users, and not yours: "
                                       "its owner should chmod 600 it")
    assert mode(journal) == 0o644 and journal.stat().st_uid == 65534
    assert database_check(json.loads(run_cli(env, "health", "--json").stdout))["status"] == "fail"


def test_migrate_and_health_leave_the_umask_alone(env, usual_umask):
    from click.testing import CliRunner

    from cronbox.cron.cli import cli

    assert CliRunner().invoke(cli, ["migrate"], env=env).exit_code == 0
    CliRunner().invoke(cli, ["health"], env=env)
    assert os.umask(0o022) == 0o022


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "mysql+pymysql://u@localhost/db",
                                 "sqlite:///file:x?mode=memory&uri=true"])
def test_databases_without_a_file_of_ours_have_no_file_check(url):
    from cronbox.cron.scheduling.health import _database_file_checks

    assert _database_file_checks(url) == []
