"""The run loop treats a connection lost inside a transaction like any lost connection: it pauses and
goes on, whether SQLAlchemy says so with the driver's error or, for a Connection whose transaction the
loss left unrolled-back, with PendingRollbackError (seen when a tick's database was cut under load)."""
from __future__ import annotations

import pytest
from sqlalchemy.exc import PendingRollbackError

from cronbox.outbox.engine import run_loop
from cronbox.outbox.engine.budget import Budget


@pytest.mark.backends("sqlite")  # no database: the loop's own handling
def test_a_pending_rollback_is_a_lost_connection_the_run_pauses_and_goes_on(monkeypatch):
    monkeypatch.setattr(run_loop, "RECONNECT_PAUSE", 0.05)
    calls = []

    def stage(budget):
        calls.append(len(calls))
        if len(calls) == 1:
            raise PendingRollbackError("Can't reconnect until invalid transaction is rolled back.")
        return 0

    result = run_loop.run_loop([stage], Budget(max_time=10, memory_mb=None), linger=False)
    assert calls == [0, 1] and result.exit_code == 0 and result.stop_reason == "empty"
