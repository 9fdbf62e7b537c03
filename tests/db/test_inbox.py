"""The inbox table: one row per (consumer, message_id), taken in the consumer's transaction."""
from __future__ import annotations

from datetime import timedelta

from cronbox.outbox.core import clock
from cronbox.outbox.events import inbox
from tests.broker_rows import add_inbox_row, inbox_count, inbox_has, take


def test_a_message_is_taken_once_per_consumer_and_only_when_committed(runtime):
    now = clock.utcnow()
    assert take(runtime, "a", "m-1", now)
    assert not take(runtime, "a", "m-1", now)  # a duplicate
    assert take(runtime, "b", "m-1", now)  # another consumer has its own row
    with runtime.engine.connect() as connection:
        transaction = connection.begin()
        assert inbox.take_first(connection, "a", "m-2", "t", "trace", now)
        transaction.rollback()  # the attempt failed: its row goes with it
    assert take(runtime, "a", "m-2", now)  # the rolled-back take left nothing
    with runtime.sessions() as session:
        assert inbox_has(session, "a", "m-2") and inbox_count(session) == 3 and inbox_count(session, "a") == 2


def test_prune_deletes_only_rows_older_than_the_cutoff(runtime):
    now = clock.utcnow()
    with runtime.sessions() as session, session.begin():
        for n in range(5):
            add_inbox_row(session, "a", f"old-{n}", now - timedelta(days=30))
        add_inbox_row(session, "a", "new", now)
    with runtime.sessions() as session, session.begin():
        assert inbox.prune(session, now - timedelta(days=7), batch=3) == 3
    with runtime.sessions() as session, session.begin():
        assert inbox.prune(session, now - timedelta(days=7), batch=3) == 2
        assert inbox.prune(session, now - timedelta(days=7), batch=3) == 0
    with runtime.sessions() as session:
        assert inbox_count(session) == 1 and inbox_has(session, "a", "new")
