"""Jobs whose ack another transaction blocks (CRONBOX_HANDLERS=tests.handlers.lockwait).

Both write TEST_INSIDE_FILE, then wait for TEST_RELEASE_FILE (the test takes a lock on the job's row,
or on the SQLite database, meanwhile); "lockwait.session" then writes a row through ctx.session, so
that its ack joins its own transaction; "lockwait.quiet" writes nothing (its ack is batched).
"""
from __future__ import annotations

from sqlalchemy import insert

import cronbox
from tests.handlers.effects import effects, wait_for_release


@cronbox.job("lockwait", name="lockwait.quiet", timeout=30, tries=3, backoff=600)
def quiet(payload, ctx):
    wait_for_release()


@cronbox.job("lockwait", name="lockwait.session", timeout=30, tries=3, backoff=600)
def with_session(payload, ctx):
    wait_for_release()
    ctx.session.execute(insert(effects).values(consumer="lockwait.session", event_id=payload["n"]))


@cronbox.consumer("lockwait", name="lockwait.consumer", timeout=30, max_attempts=3)
def consumer(event, ctx):
    """Does nothing: the tests block its delivery's claim, not its call."""
