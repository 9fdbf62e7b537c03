"""The listener without a connection (outbox.core.notify): it sleeps as a poll would, never spins,
tries to listen again at most every RETRY_LISTEN seconds, and says so once per outage."""
from __future__ import annotations

import logging
import time

from cronbox.outbox.core import notify


def test_without_a_connection_a_wait_sleeps_and_the_outage_is_logged_once(caplog, monkeypatch):
    asked = []
    listener = notify.Listener(lambda: asked.append(1) or None)
    with caplog.at_level(logging.WARNING, logger="cronbox"):
        started = time.monotonic()
        woken = [listener.wait(0.1) for _ in range(5)]
        took = time.monotonic() - started
    assert woken == [False] * 5
    assert took >= 0.45  # slept each time: no busy loop
    assert len(asked) == 1  # asked for a connection once, then not again before RETRY_LISTEN
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["listen: not listening (no connection); polling until it is back"]


def test_it_listens_again_after_the_retry_interval_and_says_so(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(notify.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(notify.time, "sleep", lambda seconds: None)
    available: list = []
    listener = notify.Listener(lambda: available[0] if available else None)
    with caplog.at_level(logging.INFO, logger="cronbox"):
        assert listener.wait(0.1) is False
        sent = []

        class Connection:  # what Listener needs of a SQLAlchemy Connection: execute(), and its DB-API one
            def __init__(self):
                self.connection = type("Fairy", (), {"dbapi_connection": Driver()})()

            def execute(self, statement):
                sent.append(str(statement))

        class Driver:
            closed = False

            def notifies(self, timeout, stop_after=None):
                return iter([type("Notify", (), {"payload": "cronbox_jobs"})()] if stop_after else [])

        available.append(Connection())
        assert listener.wait(0.1) is False and sent == []  # within RETRY_LISTEN: still polling
        now[0] += notify.RETRY_LISTEN
        assert listener.wait(0.1) is True and sent == ["LISTEN cronbox"]
    assert [r.getMessage() for r in caplog.records] == [
        "listen: not listening (no connection); polling until it is back",
        "listen: listening again; polling stays behind it",
    ]


def test_a_notification_for_another_table_does_not_wake_a_worker():
    class Driver:
        closed = False

        def notifies(self, timeout, stop_after=None):
            return iter([type("Notify", (), {"payload": "cronbox_events"})()] if stop_after else [])

    class Connection:
        connection = type("Fairy", (), {"dbapi_connection": Driver()})()

        def execute(self, statement):
            pass

    connection = Connection()
    worker = notify.Listener(lambda: connection, frozenset({"cronbox_jobs"}))
    tick = notify.Listener(lambda: connection)
    assert worker.wait(0.1) is False and tick.wait(0.1) is True
