"""README.md's quickstart, as a newcomer runs it: its `clinic.py` in a folder of its own, its two commands
under /bin/sh (`python` being this interpreter), and a payment posted to its route in between.

The event recorded in the route reaches the consumer in a tick, inside the app, and the SMS job it
dispatched in the delivery's transaction runs (the log driver), each once.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import child_env
from tests.docs_snippets import snippet

pytestmark = pytest.mark.backends("sqlite")  # the quickstart's own database: SQLite in the app's instance folder

PAGE = "README.md"
POST = """
from clinic import create_app
answer = create_app().test_client().post("/appointments/7/paid")
print(answer.status_code, answer.get_json())
"""


def shell(app: Path, command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", command], cwd=str(app), env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_readme_quickstart_records_delivers_and_sends_once(tmp_path):
    app = tmp_path / "clinic-app"
    app.mkdir()
    (app / "clinic.py").write_text(snippet(PAGE, "def text_the_patient(event, ctx):"))
    commands = snippet(PAGE, "python -m cronbox migrate")
    env = child_env({"HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
                    PYTHONPATH=f"{app}:{child_env({})['PYTHONPATH']}")

    first = shell(app, commands, env)  # cronbox's tables in the app's database; a tick with nothing to do
    assert first.returncode == 0, first.stdout + first.stderr
    assert "tick: delivered 0" in first.stdout, first.stdout

    paid = subprocess.run([sys.executable, "-c", POST], cwd=str(app), env=env, capture_output=True, text=True,
                          timeout=120)
    assert paid.returncode == 0, paid.stderr
    assert paid.stdout.strip().splitlines()[-1] == "201 {'ok': True}"

    second = shell(app, commands, env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "tick: delivered 1" in second.stdout, second.stdout
    assert shell(app, commands, env).stdout.count("tick: delivered 0") == 1  # nothing happens twice

    database = app / "instance" / "clinic.db"  # Flask-SQLAlchemy's relative sqlite:///clinic.db
    engine = create_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as connection:
            deliveries = connection.execute(text("SELECT consumer, status FROM cronbox_deliveries")).all()
            jobs = connection.execute(text("SELECT handler, status FROM cronbox_jobs")).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in deliveries] == [("clinic.sms", "done")]
    assert [tuple(row) for row in jobs] == [("cronbox.sms", "done")]
