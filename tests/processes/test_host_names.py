"""A host app's own modules named cron, storage or outbox never take cronbox's place (issue 26).

Before 0.7 cronbox installed four top-level names, and a host's `cron.py` ran instead of cronbox's
command line (exit 0, nothing relayed), a `storage.py` broke `passenger_wsgi.py`. Here the wheel is
installed in a virtualenv, the host app is started as Passenger starts it (`import passenger_wsgi`
with the app folder first on the path) and its cron line runs through `artisan_via_cron.sh` under a
bare `env -i`, with those names at the host's root, inside its package, or on PYTHONPATH, as modules
and as packages. Each of them exits the process with a message if anything ever imports it.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.package_helpers import Build, installed_build, installed_env

pytestmark = [pytest.mark.timeout(900), pytest.mark.backends("sqlite")]  # the first test waits for the build

NAMES = ("cron", "storage", "outbox")

CLINIC = '''from flask import Flask

from cronbox import Cronbox


def create_app():
    app = Flask(__name__)
    app.config["CRONBOX_HANDLERS"] = "clinic.handlers"
    Cronbox().init_app(app)

    @app.post("/pay")
    def pay():
        from cronbox import outbox
        import cronbox
        runtime = app.extensions["cronbox"].runtime
        with runtime.sessions.begin() as session:
            cronbox.record(session, "appointment.paid", {"id": 7})
        return "paid"

    return app
'''

HANDLERS = '''from pathlib import Path

from cronbox import outbox
import cronbox


@cronbox.consumer("appointment.paid", name="clinic.receipt")
def receipt(event, ctx):
    Path(__file__).resolve().parents[1].joinpath("receipt.txt").write_text(str(event.payload["id"]))
'''

PASSENGER_WSGI = "from clinic import create_app\n\napplication = create_app()\n"

# What Passenger does with passenger_wsgi.py: the app folder first on sys.path, the module imported.
PASSENGER = '''import sys
sys.path.insert(0, ".")
import passenger_wsgi
client = passenger_wsgi.application.test_client()
print(client.post("/pay").status_code)
'''


@pytest.fixture(scope="module")
def build() -> Build:
    return installed_build()


def shadow(folder: Path, name: str, as_package: bool) -> None:
    """A module (or package) of the host's named `name`, which ends the process if imported."""
    path = folder / name / "__init__.py" if as_package else folder / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"raise SystemExit('the host\\'s own {name} was imported')\n")


@pytest.mark.parametrize("as_package", [False, True], ids=["modules", "packages"])
@pytest.mark.parametrize("where", ["root", "package", "pythonpath"])
def test_the_host_app_and_its_cron_line_run_with_its_own_cron_storage_outbox(build, tmp_path, where, as_package):
    home = tmp_path / "home"
    root = home / "clinic-app"
    (root / "clinic").mkdir(parents=True)
    (root / "clinic" / "__init__.py").write_text(CLINIC)
    (root / "clinic" / "handlers.py").write_text(HANDLERS)
    (root / "passenger_wsgi.py").write_text(PASSENGER_WSGI)
    on_path = tmp_path / "on-path"
    on_path.mkdir()
    folder = {"root": root, "package": root / "clinic", "pythonpath": on_path}[where]
    for name in NAMES:
        shadow(folder, name, as_package)
    extra = {"PYTHONPATH": str(on_path)} if where == "pythonpath" else {}

    installed = subprocess.run([str(build.venv / "bin" / "cronbox"), "install-script", str(root)], cwd=str(root),
                               env=installed_env(home, **extra), capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stderr
    (root / ".env").write_text(f"CRONBOX_PYTHON={build.python}\nCRONBOX_APP=clinic:create_app\n")
    migrated = subprocess.run([str(root / "artisan_via_cron.sh"), "migrate"], cwd=str(home),
                              env=installed_env(home, **extra), capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0 and migrated.stderr == "", migrated.stderr

    started = subprocess.run([str(build.python), "-c", PASSENGER], cwd=str(root), env=installed_env(home, **extra),
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == ["200"]  # the event recorded in the app's request

    line = f"{root / 'artisan_via_cron.sh'} tick --no-linger"
    ticked = subprocess.run(["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", f"HOME={home}",
                             *(f"{k}={v}" for k, v in extra.items()), "/bin/sh", "-c", line],
                            cwd=str(home), capture_output=True, text=True, timeout=120)
    assert ticked.returncode == 0 and ticked.stdout + ticked.stderr == "", ticked.stderr
    assert (root / "receipt.txt").read_text() == "7"
    log = "".join(p.read_text() for p in (root / "instance" / "cronbox" / "logs").glob("cron-*.log"))
    assert "tick: delivered 1" in log and "was imported" not in log
