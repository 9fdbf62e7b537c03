"""The bound a run puts on its lock waits (outbox.core.lock_wait): whole seconds, 1 to LOCK_WAIT_SLICE."""
from __future__ import annotations

import math

import pytest
from sqlalchemy import create_engine

from cronbox.outbox.core.lock_wait import LOCK_WAIT_SLICE, bound_lock_wait


@pytest.mark.parametrize("remaining,expected", [(math.inf, LOCK_WAIT_SLICE), (3600.0, LOCK_WAIT_SLICE),
                                                (LOCK_WAIT_SLICE, LOCK_WAIT_SLICE), (4.2, 5), (0.3, 1), (0.0, 1),
                                                (-12.0, 1)])
def test_the_bound_follows_the_remaining_time(remaining, expected):
    engine = create_engine("sqlite://")
    with engine.connect() as connection:
        assert bound_lock_wait(connection, remaining) == expected
        assert connection.connection.cursor().execute("PRAGMA busy_timeout").fetchone()[0] == expected * 1000
