"""Sealed storage inside a host app (issue 24): every module-level `storage.*` call made in the app
(a request, a cron job under CRONBOX_APP, a `storage` command) uses the app's own store, the keys of
`<app.instance_path>/cronbox/keys`, and none is built from the environment or the working directory.

Real processes on tests/hostapp's clinic (the `host` fixture of test_host_cron.py): the job that
seals is `clinic.handlers.seal_scan`, the routes that read and link are `clinic.routes`. The last
test is the standalone app's side: a command's store keeps the settings it started with.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.processes.test_host_cron import Host, host  # noqa: F401  (the fixture)

# Sealed files from a host app's cron processes: the server behind the rows changes nothing, so SQLite
# only (.ci/run's 30 minutes; storage rows run on MariaDB and PostgreSQL in test_storage_api,
# test_storage_http and test_storage_hardening).
pytestmark = pytest.mark.backends("sqlite")

WEB = ("import sys\n"
       "from clinic import create_app\n"
       "client = create_app().test_client()\n")


def key_folders(home: Path) -> list[Path]:
    """Every folder under the test's home holding a key file (enc-* / sig-*)."""
    return sorted({path.parent for path in home.rglob("*.key")})


def stray_databases(home: Path) -> list[Path]:
    return [path for path in home.rglob("cronbox.db")]


def scan_ids(host: Host) -> list[str]:
    return [text for (text,) in host.rows("SELECT text FROM clinic_notes WHERE source = 'scan' ORDER BY id")]


def read_in_web(host: Host, file_id: str) -> str:
    """The host's web process opens the file (module-level storage.open_file in a request)."""
    proc = host.python(WEB + f"answer = client.get('/scans/{file_id}')\n"
                             "print(answer.status_code, answer.get_data(as_text=True))\n")
    return proc.stdout.splitlines()[-1]


def download_in_web(host: Host, file_id: str) -> str:
    """A link made in a request by module-level grant() and signed_url(), then downloaded."""
    proc = host.python(WEB + f"link = client.post('/scans/{file_id}/link', data={{'subject': 'patient:7'}})\n"
                             "assert link.status_code == 200, link.data\n"
                             "answer = client.get(link.get_data(as_text=True))\n"
                             "print(answer.status_code, answer.get_data(as_text=True))\n")
    return proc.stdout.splitlines()[-1]


def queue_scan(host: Host, text: str) -> None:
    host.python(WEB + f"answer = client.post('/scans', data={{'text': {text!r}, 'owner': 'patient:7'}})\n"
                      "assert answer.status_code == 202, answer.data\n")


@pytest.mark.parametrize("wander", [False, True], ids=["plain", "handler-moves-cwd-and-environ"])
def test_a_cron_jobs_storage_put_seals_under_the_apps_keys(host, tmp_path, wander):
    """The job's module-level storage.put() in a CRONBOX_APP tick writes no key of its own: the web app
    opens the file and its link downloads. A handler that moved os.chdir / CRONBOX_INSTANCE /
    CRONBOX_APP_ROOT before sealing does not move the store either."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    queue_scan(host, "x-ray of patient 7")
    extra = {"CLINIC_WANDER": str(elsewhere)} if wander else {}
    ran = host.cron("queue", "work", "--stop-when-empty", **extra)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    [file_id] = scan_ids(host)

    assert key_folders(tmp_path) == [host.root / "instance" / "cronbox" / "keys"]
    assert stray_databases(tmp_path) == [] and list(elsewhere.iterdir()) == []
    assert read_in_web(host, file_id) == "200 x-ray of patient 7"
    assert download_in_web(host, file_id) == "200 x-ray of patient 7"
    assert key_folders(tmp_path) == [host.root / "instance" / "cronbox" / "keys"]  # the web made none either


def test_the_storage_commands_under_cronbox_app_use_the_apps_store(host, tmp_path):
    """`storage put` / `grant` / `url` from cron's $HOME under CRONBOX_APP: the web app reads the file and
    the command's link downloads there."""
    scan = tmp_path / "scan.txt"
    scan.write_text("ultrasound")
    put = host.cron("storage", "put", str(scan), "--owner", "patient:9")
    assert put.returncode == 0, put.stdout + put.stderr
    file_id = put.stdout.strip()
    granted = host.cron("storage", "grant", file_id, "--subject", "patient:9")
    assert granted.returncode == 0, granted.stderr
    url = host.cron("storage", "url", granted.stdout.strip())
    assert url.returncode == 0, url.stderr
    link = url.stdout.strip().splitlines()[-1]
    assert link.startswith("/files/"), url.stdout

    assert key_folders(tmp_path) == [host.root / "instance" / "cronbox" / "keys"]
    assert stray_databases(tmp_path) == []
    assert read_in_web(host, file_id) == "200 ultrasound"
    fetched = host.python(WEB + f"answer = client.get({link!r})\nprint(answer.status_code, answer.get_data(as_text=True))\n")
    assert fetched.stdout.splitlines()[-1] == "200 ultrasound"


REFUSAL = ("error: sealed storage used outside an app context in a process with a host app: call it inside "
           "`with app.app_context():` (a request, a cronbox handler and every cron command already are), "
           "or use `cronbox.storage` there")

OUTSIDE = {
    # the app was built in this process, the call made after its context ended
    "app-built": "from clinic import create_app\ncreate_app()\n",
    # CRONBOX_APP names the host app (environment), which this script never built
    "cronbox-app-env": "",
}


@pytest.mark.parametrize("call", ["put", "grant", "signed_url", "open_file", "current"])
@pytest.mark.parametrize("case", sorted(OUTSIDE))
def test_outside_an_app_context_a_host_process_refuses_in_one_line(host, tmp_path, case, call):
    calls = {"put": "storage.put(None, io.BytesIO(b'x'), filename='a', content_type='text/plain', owner='p:1')",
             "grant": "storage.grant(None, 'f' * 32, 'p:1')", "signed_url": "storage.signed_url('g' * 32)",
             "open_file": "storage.open_file(None, 'f' * 32)", "current": "storage.current()"}
    code = ("import io\nfrom cronbox import storage\n" + OUTSIDE[case] +
            f"try:\n    {calls[call]}\nexcept storage.NoAppContext as exc:\n    print('error:', exc)\n")
    extra = {"CRONBOX_APP": "clinic:create_app"} if case == "cronbox-app-env" else {}
    proc = host.python(code, **extra)
    assert proc.stdout.splitlines() == [REFUSAL]
    assert key_folders(tmp_path) == [] and stray_databases(tmp_path) == []


STANDALONE_JOB = '''
import io
import os

import cronbox
from cronbox import storage


@cronbox.job("scans", name="standalone.seal")
def seal(payload, ctx):
    os.chdir(payload["away"])
    os.environ.update(CRONBOX_INSTANCE=payload["away"], CRONBOX_APP_ROOT=payload["away"])
    storage.put(ctx.session, io.BytesIO(b"scan"), filename="s.txt", content_type="text/plain", owner="patient:1")
'''


def test_a_standalone_jobs_storage_put_keeps_the_settings_the_command_started_with(env, runtime, registry, tmp_path):
    """Without a host app the store comes from the settings the command resolved at start: a handler that
    moves cwd, CRONBOX_INSTANCE and CRONBOX_APP_ROOT before its first storage.put() does not move it."""
    import cronbox
    from tests.conftest import APP_ROOT, run_cli

    away = tmp_path / "away"
    away.mkdir()
    (tmp_path / "standalone_jobs.py").write_text(STANDALONE_JOB)
    seal = cronbox.job("scans", name="standalone.seal", registry=registry)(lambda payload, ctx: None)
    with runtime.sessions.begin() as session:
        seal.dispatch(session, {"away": str(away)})
    ran = run_cli(env, "queue", "work", "--stop-when-empty", CRONBOX_HANDLERS="standalone_jobs",
                  PYTHONPATH=f"{APP_ROOT}:{tmp_path}")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert key_folders(tmp_path) == [runtime.settings.key_folder]
    assert list(away.iterdir()) == []
    with runtime.sessions() as session:
        assert session.scalar(text("SELECT status FROM cronbox_jobs")) == "done"
