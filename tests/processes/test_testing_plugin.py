"""The pytest plugin as a user has it: a small project of their own (handlers, a conftest giving
`cronbox_app`, tests using `cronbox_kit`, `cronbox_inline` and the module-level functions) run by a
pytest of its own in a subprocess, outside Flask, on a SQLite file. The plugin is named with `-p` here
(this checkout is not installed); the wheel's entry point is checked below, and examples/clinic's tests
load it from the entry point of an installed cronbox (tests/processes/test_example_app.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import APP_ROOT, child_env

HANDLERS = '''
from cronbox import consumer, job


@consumer("order.placed", name="shop.confirm")
def confirm(event, ctx):
    ship.dispatch(ctx.session, {"order": event.payload["order"]})


@job("shipping", name="shop.ship", tries=2, backoff=[60])
def ship(payload, ctx):
    if payload["order"] == 13:
        raise RuntimeError("no courier")
'''

CONFTEST = '''
import pytest


@pytest.fixture
def cronbox_app(tmp_path):
    from cronbox.outbox import load_settings, open_runtime

    settings = load_settings(environ={"DATABASE_URL": f"sqlite:///{tmp_path}/shop.db", "CRONBOX_HANDLERS": "shop",
                                      "CRONBOX_INSTANCE": str(tmp_path / "instance")})
    runtime = open_runtime(settings=settings)  # a fresh SQLite database is migrated on first use
    yield runtime
    runtime.dispose()


@pytest.fixture
def cronbox_session(cronbox_app):
    return cronbox_app.sessions  # the shop writes through cronbox's own sessions here
'''

TESTS = '''
from datetime import timedelta

from cronbox import record
from cronbox.testing import assert_dispatched, clock, drain

from shop import ship


def place(sessions, order):
    with sessions.begin() as session:
        record(session, "order.placed", {"order": order})


def test_manual(cronbox_kit, cronbox_app):
    place(cronbox_app.sessions, 7)
    cronbox_kit.refute_dispatched(ship)
    cronbox_kit.deliver()
    assert_dispatched(ship, order=7)  # the module-level function: the fixture's kit
    assert drain().done == 1
    assert cronbox_kit.dispatched(ship)[0].done


def test_retried_through_time(cronbox_kit, cronbox_app):
    place(cronbox_app.sessions, 13)
    cronbox_kit.deliver()
    cronbox_kit.drain()
    [job] = cronbox_kit.dispatched(ship)
    assert job.retrying and job.last_error == "RuntimeError: no courier"
    clock.advance(minutes=1)
    cronbox_kit.drain()
    assert cronbox_kit.dispatched(ship)[0].failed


def test_inline(cronbox_inline, cronbox_app):
    place(cronbox_app.sessions, 8)
    assert cronbox_inline.dispatched(ship, order=8)[0].done  # ran at the commit


def test_a_failing_assertion_says_what_was_there(cronbox_kit, cronbox_app):
    place(cronbox_app.sessions, 9)
    cronbox_kit.deliver()
    cronbox_kit.assert_dispatched(ship, order=99)
'''

INERT = '''
import sys


def test_the_plugin_loaded_nothing_heavy():
    loaded = sorted(name for name in sys.modules
                    if name.split(".")[0] in ("sqlalchemy", "flask") or name == "cronbox.testing.kit")
    print("LOADED", loaded)
    assert loaded == []
'''


def pytest_run(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = child_env({}, PYTHONPATH=f"{APP_ROOT}:{project}")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "cronbox.testing.plugin", "-p", "no:cacheprovider",
                           "-q", *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "shop_project"
    (root / "shop").mkdir(parents=True)
    (root / "shop" / "__init__.py").write_text(textwrap.dedent(HANDLERS))
    (root / "tests").mkdir()
    (root / "tests" / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (root / "tests" / "test_shop.py").write_text(textwrap.dedent(TESTS))
    (root / "inert").mkdir()
    (root / "inert" / "test_inert.py").write_text(textwrap.dedent(INERT))
    (root / "pytest.ini").write_text("[pytest]\n")
    return root


def test_a_users_tests_use_the_plugins_fixtures(project):
    done = pytest_run(project, "tests", "-p", "no:xdist")
    summary = done.stdout.strip().splitlines()[-1]
    assert "3 passed" in summary and "1 failed" in summary, done.stdout[-4000:] + done.stderr[-2000:]
    assert "no job 'shop.ship' with order=99 was dispatched" in done.stdout
    assert '#1 shop.ship on shipping (ready, attempts 0) {"order": 9}' in done.stdout
    assert "order: 9 (expected 99)" in done.stdout


def test_the_plugin_does_nothing_until_a_test_asks_for_its_fixtures(project):
    done = pytest_run(project, "inert", "-p", "no:xdist", "-s")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "LOADED []" in done.stdout
    fixtures = pytest_run(project, "inert", "-p", "no:xdist", "--fixtures")
    assert "cronbox_kit" in fixtures.stdout and "cronbox_inline" in fixtures.stdout


def test_a_missing_cronbox_app_fixture_says_what_to_define(project):
    (project / "inert" / "test_unset.py").write_text("def test_needs_app(cronbox_kit):\n    pass\n")
    done = pytest_run(project, "inert/test_unset.py", "-p", "no:xdist")
    assert done.returncode == 1
    assert "define a fixture named cronbox_app returning your Flask app" in done.stdout


@pytest.mark.timeout(900)
def test_the_installed_package_declares_the_plugin(installed_venv):
    found = subprocess.run([str(installed_venv), "-c", "from importlib.metadata import entry_points; import json; "
                            "print(json.dumps([[e.name, e.value] for e in entry_points(group='pytest11')]))"],
                           capture_output=True, text=True, timeout=120, cwd="/")
    assert ["cronbox.testing.plugin", "cronbox.testing.plugin"] in json.loads(found.stdout), found.stderr
