"""Every instance path the docs name (README.md and docs/) is where cronbox really puts or reads it
(issue 24: a `migrate.cmd` dropped where the README said was ignored in a host app).

The docs write them `<instance>/...` and say once, in docs/install.md, what `<instance>` is:
`instance/` in the app root for the standalone app, `instance/cronbox/` for a host app. Each path named is checked here
against tests/hostapp's clinic run by cron (`artisan_via_cron.sh` under `env -i`, CRONBOX_APP in its
.env), and the standalone's own folder against a bare app root. A path the README gains without a
check here fails the first test.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from tests.conftest import APP_ROOT, child_env
from tests.docs_snippets import all_text
from tests.processes.test_host_cron import Host, artisan_root, finish, host  # noqa: F401  (the fixture)

# The README's paths and file names as a host app uses them: the server changes nothing, so not
# PostgreSQL too (.ci/run's 30 minutes; the README's code runs on it in tests/db/test_readme.py).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

DOCS = all_text()
NAMED = re.compile(r"<instance>/([\w.-]+(?:/[\w.-]+)*/?)")
# `instance/...` written without `<instance>`: each is right as written, for the reason given.
AS_WRITTEN = {
    "instance/cronbox.db": "'Try it' runs the standalone checkout",
    "instance/": "the app root's folder (CRONBOX_APP_ROOT row; the definition of <instance>; the clinic's "
                 "relative SQLite URL, which is Flask-SQLAlchemy's instance folder)",
    "instance/cronbox": "the default instance with CRONBOX_APP (artisan_via_cron.sh's log)",
    "instance/cronbox/": "the definition of <instance> for a host app",
    "instance/cronbox/keys/": "a host app's keys, beside <instance>/keys/",
    "instance/app.db": "the host app's own database file, in Flask's instance folder (not cronbox's)",
}
CHECKED = {"cronbox.db", "keys", "keys/", "keys/enc-NNNN-xxxxxxxx.key", "keys/sig-NNNN-xxxxxxxx.key", "logs/",
           "logs/cron-YYYY-MM-DD.log", "logs/cronbox-YYYY-MM-DD.log", "ops-password", "ops-setup-token", "private/",
           "run-once/", "run-once/archive/", "run-once/migrate.cmd"}


def test_the_docs_name_instance_paths_as_checked_here():
    named = {match.rstrip(".") for match in NAMED.findall(DOCS)}
    assert named == CHECKED, f"a docs path without a check here: {named - CHECKED}; gone: {CHECKED - named}"
    bare = set(re.findall(r"(?<![<\w/.-])instance/[\w./-]*", DOCS))
    assert bare <= set(AS_WRITTEN), f"write these as <instance>/...: {bare - set(AS_WRITTEN)}"
    definition = ("`<instance>` is cronbox's instance folder: `instance/` in the app root for the standalone app,\n"
                  "`instance/cronbox/` for your own Flask app")
    assert definition in (APP_ROOT / "docs" / "install.md").read_text(encoding="utf-8")


def today() -> str:
    return f"{datetime.now(timezone.utc):%Y-%m-%d}"


def artisan(host: Host, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """One cron line (`env -i`, /bin/sh, $HOME), everything from the app root's .env."""
    proc = host.start_artisan(*args) if stdin is None else None
    if proc is None:
        line = " ".join([str(host.root / "artisan_via_cron.sh"), *args])
        return subprocess.run(["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", f"HOME={host.home}", "/bin/sh", "-c", line],
                              cwd=str(host.home), input=stdin, capture_output=True, text=True, timeout=120)
    return finish(proc)


def test_every_docs_instance_path_is_where_a_host_app_has_it(host, tmp_path):
    artisan_root(host)
    instance = host.root / "instance" / "cronbox"  # <instance> for a host app

    # <instance>/run-once/migrate.cmd: the next tick runs it and files it in <instance>/run-once/archive/;
    # <instance>/run-once/ is the operator's to make (0700), as docs/howto/cpanel.md says
    inbox = instance / "run-once"
    assert not inbox.exists()
    inbox.mkdir(mode=0o700, parents=True, exist_ok=True)
    (inbox / "migrate.cmd").write_text("migrate\n")
    past = time.time() - 60  # older than the 10 s a file waits
    os.utime(inbox / "migrate.cmd", (past, past))
    ticked = artisan(host, "tick", "--no-linger")
    assert ticked.returncode == 0, ticked.stdout + ticked.stderr
    assert not (inbox / "migrate.cmd").exists()
    assert [p.name.split("-", 2)[-1] for p in (inbox / "archive").iterdir()] == ["migrate.cmd"]
    listed = host.cron("once", "list")  # (the script prints nothing on success: its output is in the log)
    assert re.search(r"\bmigrate\b", listed.stdout) and "done" in listed.stdout, listed.stdout

    # <instance>/logs/: the cron script's log and the commands' own
    assert (instance / "logs" / f"cron-{today()}.log").is_file()
    assert (instance / "logs" / f"cronbox-{today()}.log").is_file()

    # <instance>/keys/: created on first use
    scan = tmp_path / "scan.txt"
    scan.write_text("scan")
    put = artisan(host, "storage", "put", str(scan), "--owner", "patient:1")
    assert put.returncode == 0, put.stdout + put.stderr
    assert sorted(p.name[:4] for p in (instance / "keys").glob("*.key")) == ["enc-", "sig-"]
    # <instance>/keys/enc-NNNN-xxxxxxxx.key, <instance>/keys/sig-NNNN-xxxxxxxx.key; <instance>/private/
    assert all(re.fullmatch(r"(enc|sig)-\d{4}-[0-9a-f]{8}\.key", p.name) for p in (instance / "keys").glob("*.key"))
    assert len(list((instance / "private").rglob("*.sealed"))) == 1

    # <instance>/ops-setup-token and <instance>/ops-password
    assert artisan(host, "ops", "setup-token").returncode == 0
    assert (instance / "ops-setup-token").is_file()
    password = artisan(host, "ops", "set-password", stdin="correct horse battery staple\n")
    assert password.returncode == 0, password.stdout + password.stderr
    assert (instance / "ops-password").is_file()

    # <instance>/cronbox.db is the standalone app's database: a host app's cronbox uses the host's
    assert not list(host.root.rglob("cronbox.db"))
    assert not (host.root / "instance" / "keys").exists() and not (host.root / "instance" / "logs").exists()


@pytest.mark.backends("sqlite")
def test_the_standalone_instance_is_instance_in_the_app_root(tmp_path):
    """`<instance>` for the standalone app: `instance/` in the app root, the database file included."""
    root = tmp_path / "app"
    root.mkdir()
    (root / ".env").write_text("CRONBOX_HANDLERS=\n")
    env = child_env({"CRONBOX_APP_ROOT": str(root)})
    proc = subprocess.run([sys.executable, "-m", "cronbox", "tick", "--no-linger"], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (root / "instance" / "cronbox.db").is_file()
    assert (root / "instance" / "logs" / f"cronbox-{today()}.log").is_file()
