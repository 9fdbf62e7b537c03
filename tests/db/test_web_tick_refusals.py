"""POST /cron/tick meets a set-up the tick refuses to run with: the line the cron command prints,
as JSON with a 500, one log line, no traceback, and none of the host's error handlers involved.

Each class of refusal (a consumer placed ambiguously next to a forward target, a bad setting read by
the tick, a handler module that does not import), through the standalone app and a host app, on
SQLite and MariaDB.
"""
from __future__ import annotations

import os

import pytest
from flask import Flask, got_request_exception, jsonify

from cronbox import Cronbox
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.events.forward import forward
from tests.conftest import ONE_MYSQL_MODE

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)

TOKEN = "tick-token"


def standalone(settings) -> Flask:
    from app import create_app

    return create_app(settings)


def host(settings) -> Flask:
    """A host app with error handlers of its own for everything: none of them may answer."""
    app = Flask("clinic")
    app.config["TESTING"] = False  # as in production: an unhandled error goes to the handlers

    @app.errorhandler(500)
    def host_500(error):
        return jsonify(host="500 handler"), 500

    @app.errorhandler(Exception)
    def host_any(error):
        return jsonify(host="exception handler"), 500

    Cronbox().init_app(app, settings=settings)
    return app


def ambiguous_placement(app: Flask) -> None:
    registry = Registry()
    consumer("appt.paid", name="notify", registry=registry)(lambda event, ctx: None)
    forward("appt.*", exchange="clinic", name="to-broker", registry=registry)
    app.extensions["cronbox"].runtime.registry = registry


REFUSALS = {
    # name: (extra settings, set-up after the app is built, words the one line must hold)
    "placement": ({}, ambiguous_placement, ["'notify'", "'to-broker'", 'runs="tick"']),
    "placement-both-unsaid": ({}, lambda app: both_unsaid(app), ["'first'", "runs="]),
    "setting-not-a-number": ({"CRONBOX_TICK_WORKERS": "two"}, None, ["CRONBOX_TICK_WORKERS"]),
    "setting-below-minimum": ({"CRONBOX_TICK_WORKERS": "0"}, None, ["CRONBOX_TICK_WORKERS"]),
    "setting-over-connections": ({"CRONBOX_TICK_WORKERS": "40", "CRONBOX_MAX_CONNECTIONS": "3"}, None,
                                 ["CRONBOX_TICK_WORKERS", "CRONBOX_MAX_CONNECTIONS"]),
    "handler-missing": ({"CRONBOX_HANDLERS": "tests.handlers.no_such_module"}, None,
                        ["CRONBOX_HANDLERS", "tests.handlers.no_such_module"]),
    "handler-raises": ({"CRONBOX_HANDLERS": "tests.handlers.broken_import"}, None,
                       ["CRONBOX_HANDLERS", "tests.handlers.broken_import", "RuntimeError"]),
}


def both_unsaid(app: Flask) -> None:
    registry = Registry()
    forward("*", exchange="all", registry=registry)
    consumer("a", name="first", registry=registry)(lambda event, ctx: None)
    consumer("b", name="second", registry=registry)(lambda event, ctx: None)
    app.extensions["cronbox"].runtime.registry = registry


@pytest.mark.parametrize("make", [standalone, host], ids=["standalone", "host"])
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refused_set_up_is_one_json_line_with_a_500(case, make, env, settings, runtime):
    extra, set_up, words = REFUSALS[case]
    app = make(load_settings(environ={**env, "CRONBOX_CRON_TOKEN": TOKEN, **extra}))
    raised = []
    got_request_exception.connect(lambda sender, exception, **kw: raised.append(exception), app)
    try:
        if set_up:
            set_up(app)
        handlers_before = {k: dict(v) for k, v in app.error_handler_spec.items()}
        answer = app.test_client().post("/cron/tick", headers={"Authorization": f"Bearer {TOKEN}"})
        body = answer.get_json()
        assert answer.status_code == 500 and set(body) == {"status", "error"} and body["status"] == "error", body
        line = body["error"]
        assert "\n" not in line and "Traceback" not in answer.get_data(as_text=True)
        assert all(word in line for word in words), line
        assert answer.headers["Cache-Control"] == "no-store"
        assert raised == []  # nothing reached Flask's unhandled-error path, so no host handler ran
        assert {k: dict(v) for k, v in app.error_handler_spec.items()} == handlers_before
        log = "".join(path.read_text() for path in sorted(settings.logs_dir.glob("*.log")))
        assert [entry.split(" ERROR ", 1)[1] for entry in log.splitlines() if " ERROR " in entry] == [
            f"[{os.getpid()}] web tick refused: {line}"]
        assert "Traceback" not in log
        # a caller without the token learns nothing of it
        stranger = app.test_client().post("/cron/tick", headers={"Authorization": "Bearer nope"})
        assert stranger.status_code == 403 and line not in stranger.get_data(as_text=True)
    finally:
        own = app.extensions["cronbox"]._runtime
        if own is not None:
            own.dispose()


def test_a_refused_tick_takes_the_tick_lock_back(env, runtime):
    """After a refusal the cron line's tick is not left skipped: the lock was released."""
    app = standalone(load_settings(environ={**env, "CRONBOX_CRON_TOKEN": TOKEN}))
    ambiguous_placement(app)
    try:
        assert app.test_client().post("/cron/tick", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 500
        lock = runtime.lock("tick")
        assert lock.acquire()
        lock.release()
    finally:
        app.extensions["cronbox"].runtime.dispose()
