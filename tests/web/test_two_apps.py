"""Two Flask apps in one process, each with its own CRONBOX_HANDLERS (issue 26): each app's runtime
runs what its handler modules define or import, and cronbox's built-ins; neither runs the other's
consumers, jobs, tasks or forward targets, nor those of a module neither names nor imports. A cron
process's app names in its log each declaration it leaves out."""
from __future__ import annotations

import importlib
import logging
import os

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from cronbox import Cronbox, record
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.registry import DEFAULT
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.queue.worker import Worker
from cronbox.web.state import state
from tests.handlers.two_apps import ran
from tests.helpers import relay

pytestmark = pytest.mark.backends("sqlite")

FRONT, BACK = "tests.handlers.two_apps.front", "tests.handlers.two_apps.back"


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("CRONBOX_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    ran.RAN.clear()
    yield
    ran.RAN.clear()


def make_app(tmp_path, name: str, handlers: str) -> tuple[Flask, SQLAlchemy]:
    root = tmp_path / name
    root.mkdir()
    app = Flask(name, root_path=str(root), instance_path=str(root / "instance"))
    app.config.update(SQLALCHEMY_DATABASE_URI=f"sqlite:///{root / 'app.db'}", CRONBOX_HANDLERS=handlers)
    db = SQLAlchemy()
    db.init_app(app)
    Cronbox(app, db=db)
    return app, db


@pytest.fixture
def apps(tmp_path, clean_env):
    importlib.import_module("tests.handlers.two_apps.stray")  # in the process, in neither app
    front, front_db = make_app(tmp_path, "front", FRONT)
    back, back_db = make_app(tmp_path, "back", BACK)
    for app in (front, back):
        state(app).checked_runtime()  # migrates each app's fresh SQLite database
    yield (front, front_db), (back, back_db)
    for app in (front, back):
        state(app).runtime.dispose()


def own_names(named) -> set[str]:
    """What a registry holds, less cronbox's built-ins (every app has those)."""
    return {name for name in named.names() if not name.startswith("cronbox.")}


def test_each_app_holds_what_its_handler_modules_define_or_import(apps):
    (front, _), (back, _) = apps
    importlib.import_module("tests.handlers.two_apps.back.late")  # imported by nobody's handler module
    f, b = state(front).checked_runtime().registry, state(back).checked_runtime().registry
    assert own_names(f.consumers) == {"front.receipt", "front.to-broker"}
    assert own_names(b.consumers) == {"back.ledger", "back.refund"}
    assert own_names(f.jobs) == {"two_apps.remind"} and own_names(b.jobs) == {"two_apps.report", "two_apps.dotted"}
    assert own_names(f.tasks) == set() and own_names(b.tasks) == {"back.reconcile"}
    assert [c.name for c in f.consumers.for_type("two_apps.visit.paid")] == ["front.to-broker", "front.receipt"]
    assert f.consumers.get("back.ledger") is None and b.consumers.get("front.receipt") is None
    assert b.jobs.get("two_apps.remind") is None and "reports" not in f.jobs.queues()
    # ... and both hold cronbox's own: the channels' jobs and alert, the built-in tasks.
    from cronbox import send_sms  # noqa: F401  (registers the channels' jobs, after both apps were built)

    for registry in (f, b):
        assert registry.jobs.get("cronbox.sms") is not None and registry.tasks.get("cronbox.prune") is not None
        assert registry.pause_listeners == DEFAULT.pause_listeners != []
    # The process-wide registry still holds everything: the stray consumer is declared, just nobody's.
    assert DEFAULT.consumers.get("stray.audit") is not None


def test_each_apps_tick_runs_its_own_consumers_and_jobs_in_its_own_context(apps):
    (front, front_db), (back, back_db) = apps
    for app, db, amount in ((front, front_db, 1), (back, back_db, 2)):
        with app.app_context():
            record(db.session, "two_apps.visit.paid", {"amount": amount})
            if app is front:
                from tests.handlers.two_apps.shared_jobs import remind

                remind.dispatch(db.session, {"amount": amount})
            else:
                from tests.handlers.two_apps.reports import report

                report.dispatch(db.session, {"amount": amount})
            db.session.commit()
    for app in (front, back):
        runtime = state(app).checked_runtime()
        with app.app_context():
            relay(runtime)
            Worker(runtime).run(Budget(max_time=30, memory_mb=None))
    assert sorted(ran.RAN) == sorted([
        ("front", "front.receipt", {"amount": 1}), ("front", "two_apps.remind", {"amount": 1}),
        ("back", "back.ledger", {"amount": 2}), ("back", "two_apps.report", {"amount": 2}),
    ])


def test_a_job_of_the_other_app_waits_rather_than_running_or_failing(apps):
    (front, front_db), (back, _) = apps
    from tests.handlers.two_apps.reports import report  # back's job, dispatched into front's database

    with front.app_context():
        job_id = report.dispatch(front_db.session, {"amount": 3})
        front_db.session.commit()
    runtime = state(front).checked_runtime()
    with front.app_context():
        Worker(runtime, ["reports"]).run(Budget(max_time=10, memory_mb=None))
    assert ran.RAN == []
    from cronbox.outbox.queue.models import READY, Job

    with runtime.sessions() as session:
        job = session.get(Job, job_id)
        assert (job.status, job.attempts) == (READY, 0)  # waits for a process that has its handler


def test_a_cron_processs_app_logs_each_declaration_it_leaves_out(apps, caplog):
    (front, _), _ = apps
    runtime = Runtime(state(front).settings, role="cron")
    try:
        with caplog.at_level(logging.WARNING, logger="cronbox"):
            state(front).attach_cron(runtime)
        left_out = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not run by this app")]
        assert ("not run by this app: consumer stray.audit is declared in tests.handlers.two_apps.stray, "
                f"which CRONBOX_HANDLERS ({FRONT}) neither names nor imports") in left_out
        assert any("job two_apps.report is declared in tests.handlers.two_apps.reports" in m for m in left_out)
        assert not any("front." in m or "two_apps.remind" in m or "cronbox." in m for m in left_out)
        assert runtime.consumers.get("stray.audit") is None and runtime.jobs.get("two_apps.remind") is not None
    finally:
        runtime.dispose()
