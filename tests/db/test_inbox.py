"""The inbox table: one row per (consumer, message_id), taken in the consumer's transaction."""
from __future__ import annotations

from datetime import timedelta

import pytest

from outbox.core import clock
from outbox.events import inbox


def test_a_message_is_taken_once_per_consumer_and_only_when_committed(runtime):
    now = clock.utcnow()
    with runtime.sessions() as session, session.begin():
        assert inbox.take(session, "a", "m-1", "t", "trace", now)
        assert not inbox.take(session, "a", "m-1", "t", "trace", now)  # same transaction: a duplicate
        assert inbox.take(session, "b", "m-1", "t", "trace", now)  # another consumer has its own row
    with runtime.sessions() as session, session.begin():
        assert inbox.take(session, "a", "m-2", "t", None, now)
        session.rollback()
    with runtime.sessions() as session, session.begin():
        assert not inbox.take(session, "a", "m-1", "t", None, now)
        assert inbox.take(session, "a", "m-2", "t", None, now)  # the rolled-back take left nothing
        assert inbox.has(session, "a", "m-2") and inbox.count(session) == 3 and inbox.count(session, "a") == 2


def test_a_duplicate_leaves_the_transaction_usable(runtime):
    now = clock.utcnow()
    with runtime.sessions() as session, session.begin():
        inbox.take(session, "a", "m-1", "t", None, now)
    with runtime.sessions() as session, session.begin():
        assert not inbox.take(session, "a", "m-1", "t", None, now)
        assert inbox.take(session, "a", "m-3", "t", None, now)
    with runtime.sessions() as session:
        assert inbox.count(session) == 2


def test_prune_deletes_only_rows_older_than_the_cutoff(runtime):
    now = clock.utcnow()
    with runtime.sessions() as session, session.begin():
        for n in range(5):
            inbox.take(session, "a", f"old-{n}", "t", None, now - timedelta(days=30))
        inbox.take(session, "a", "new", "t", None, now)
    with runtime.sessions() as session, session.begin():
        assert inbox.prune(session, now - timedelta(days=7), batch=3) == 3
    with runtime.sessions() as session, session.begin():
        assert inbox.prune(session, now - timedelta(days=7), batch=3) == 2
        assert inbox.prune(session, now - timedelta(days=7), batch=3) == 0
    with runtime.sessions() as session:
        assert inbox.count(session) == 1 and inbox.has(session, "a", "new")
