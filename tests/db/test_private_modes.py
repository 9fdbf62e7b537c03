"""Files cronbox creates in the instance folder are 0600 and its folders 0700 (issue 12): the database
and its -wal/-shm (job payloads, audit subjects), logs, locks, keys, sealed files, run-once archive,
the console's setup token. On every backend (the database files only exist on SQLite)."""
from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from cronbox.cron.scheduling import health
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.runtime import Runtime
from tests.conftest import ONE_MYSQL_MODE, run_cli

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)


@pytest.fixture
def usual_umask():
    previous = os.umask(0o022)  # what a shared host's cron and Passenger start with
    yield
    os.umask(previous)


def _modes(folder: Path) -> tuple[dict[str, int], dict[str, int]]:
    files, folders = {}, {str(folder): stat.S_IMODE(os.stat(folder).st_mode)}
    for root, dirs, names in os.walk(folder):
        for name in dirs:
            folders[os.path.join(root, name)] = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
        for name in names:
            files[os.path.join(root, name)] = stat.S_IMODE(os.lstat(os.path.join(root, name)).st_mode)
    return files, folders


def test_everything_cronbox_creates_is_private(env, usual_umask, tmp_path):
    instance = Path(env["CRONBOX_INSTANCE"])
    assert run_cli(env, "migrate").returncode == 0
    upload = tmp_path / "scan.pdf"
    upload.write_bytes(b"%PDF secret")
    assert run_cli(env, "storage", "put", str(upload), "--owner", "patient:1").returncode == 0
    request = instance / "run-once" / "a.cmd"
    request.parent.mkdir(mode=0o700, exist_ok=True)  # the operator's inbox (File Manager)
    request.write_bytes(b"queue status\n")  # as File Manager writes it: 0644
    os.utime(request, (time.time() - 60, time.time() - 60))
    assert run_cli(env, "once", "run").returncode == 0
    assert run_cli(env, "tick", "--max-time", "1", "--no-linger").returncode == 0
    assert run_cli(env, "ops", "setup-token").returncode == 0

    settings = load_settings(environ=env)
    rt = Runtime(settings)  # an open connection: SQLite's -wal and -shm exist now
    try:
        with rt.engine.begin() as connection:
            connection.execute(text("DELETE FROM cronbox_rate_windows WHERE bucket = 'x'"))
            files, folders = _modes(instance)
    finally:
        rt.dispose()
    if settings.database_url.startswith("sqlite"):
        assert {"cronbox.db", "cronbox.db-wal", "cronbox.db-shm"} <= {Path(p).name for p in files}
    assert any(p.endswith(".sealed") for p in files) and any(p.endswith(".log") for p in files)
    assert any(p.endswith(".lock") for p in files) and any(p.endswith(".key") for p in files)
    assert any("archive" in p for p in files)
    assert {p: oct(m) for p, m in files.items() if m & 0o077} == {}
    assert {p: oct(m) for p, m in folders.items() if m != 0o700} == {}


@pytest.mark.backends("sqlite")  # only SQLite keeps the database in a file
def test_an_older_wider_database_file_of_ours_is_narrowed(env, usual_umask):
    instance = Path(env["CRONBOX_INSTANCE"])
    instance.mkdir(mode=0o700)
    database = instance / "cronbox.db"
    database.write_bytes(b"")
    database.chmod(0o644)
    rt = Runtime(load_settings(environ=env))
    try:
        with rt.engine.begin() as connection:
            connection.execute(text("CREATE TABLE t (x INTEGER)"))
            modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in instance.glob("cronbox.db*")}
    finally:
        rt.dispose()
    assert modes == {"cronbox.db": "0o600", "cronbox.db-wal": "0o600", "cronbox.db-shm": "0o600"}


def test_a_world_readable_instance_folder_is_still_a_health_failure(env):
    instance = Path(env["CRONBOX_INSTANCE"])
    instance.mkdir(mode=0o700)
    instance.chmod(0o755)
    check = health._instance_check(instance)
    assert check.status == health.FAIL and f"chmod 700 {instance}" in check.detail


def test_every_permission_failure_of_health_names_the_path_its_chmod_fixes(env, tmp_path):
    """`health` names each path with the `chmod` that fixes it (issue 37: "chmod 700 it" said which
    folder nowhere): the instance folder, a key file, the database's folder, as the
    operator reads them from `python -m cronbox health`."""
    instance = Path(env["CRONBOX_INSTANCE"])
    assert run_cli(env, "migrate").returncode == 0
    assert run_cli(env, "storage", "keys").returncode == 0  # creates the keys
    instance.chmod(0o755)
    database = instance / "cronbox.db"  # SQLite's only (cronbox narrows its own file as it opens it)
    [key, *_] = sorted((instance / "keys").glob("*.key"))
    key.chmod(0o644)
    done = run_cli(env, "health", "--json")
    failing = {c["name"]: c["detail"] for c in json.loads(done.stdout)["checks"] if c["status"] == "fail"}
    fixes = [detail for detail in failing.values() if "chmod" in detail]
    assert len(fixes) >= 2 + database.exists(), failing
    for detail in fixes:
        for command in re.findall(r"chmod \d+( [^;:()]*)?", detail):
            assert command.strip().startswith("/"), f"a chmod without its path: {detail!r}"
    assert f"chmod 700 {instance}" in failing["instance"]
    assert f"chmod 600 {key}" in failing[f"key.{key.name}"]
    if database.exists():
        assert f"chmod 700 {instance}" in failing["database_file"]
