"""A run bounds the lock waits of every connection it takes, not only its batch's writes
(outbox.core.lock_wait.run_lock_waits): each checkout gets min(LOCK_WAIT_SLICE, remaining), at least 1 s,
on the real server's session variable / SQLite's busy_timeout; after the run, no bound is put on."""
from __future__ import annotations

import math

from sqlalchemy import text

from cronbox.outbox.core.lock_wait import LOCK_WAIT_SLICE, run_lock_waits


def session_wait(runtime) -> float:
    with runtime.engine.connect() as connection:
        if runtime.is_postgresql:
            shown = connection.execute(text("SHOW lock_timeout")).scalar_one()  # "10s", or "0" unbounded
            return float(shown.removesuffix("s")) if shown.endswith("s") else float(shown) / 1000
        if runtime.is_mysql:
            return connection.execute(text("SELECT @@session.innodb_lock_wait_timeout")).scalar_one()
        return connection.exec_driver_sql("PRAGMA busy_timeout").scalar_one() / 1000


def test_every_connection_a_run_takes_waits_no_longer_than_its_remaining_time(runtime):
    remaining = [math.inf]
    with run_lock_waits(runtime.engine, lambda: remaining[0]):
        for left, bound in [(math.inf, LOCK_WAIT_SLICE), (4.2, 5), (0.2, 1), (-3.0, 1), (30.0, LOCK_WAIT_SLICE)]:
            remaining[0] = left
            assert session_wait(runtime) == bound, left
        remaining[0] = 2.0
    assert session_wait(runtime) != 2  # the run is over: its listener is gone
