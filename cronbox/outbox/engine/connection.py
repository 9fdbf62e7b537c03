"""The run's database: the one connection a round holds, and the short transactions of its writes.

Every write of a run (claims, outcomes, the job gate) goes through `RunConnection.transaction`: a
short transaction on the held connection (never one across handlers: every checkout would cost a
pre-ping and a reset ROLLBACK, two round trips per item), its lock waits bounded by what is left
of the run's budget and its lock conflicts retried while the run has time (outbox.core.lock_wait,
outbox.core.transactions). While held, the engine's handle_error listener tells the commit group
open on it, if any, about a failed statement (a handler's raw SQL too: CommitGroup.lose_on_error).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from cronbox.outbox.core.engines import session_factory
from cronbox.outbox.core.lock_wait import bound_lock_wait
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.budget import Budget


class RunConnection:
    """A run's connection (while `held`), its sessions and the budget that bounds its writes."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.sessions = runtime.sessions  # the held connection's, while held
        self.connection: Connection | None = None
        self.budget: Budget | None = None  # the run's: bounds lock waits and retries
        self.group: Any = None  # the commit group whose transaction is open on the connection, if any
        self._on_error = self._watch_group  # one bound method, to remove the listener again

    @contextmanager
    def held(self) -> Iterator[Connection]:
        """The round's connection, held until the block ends."""
        self.runtime.claim_mode()  # may ask the server its version: before we hold the only connection
        engine = self.runtime.engine
        with engine.connect() as connection:
            self.connection, self.sessions = connection, session_factory(connection)
            event.listen(engine, "handle_error", self._on_error)
            try:
                yield connection
            finally:
                event.remove(engine, "handle_error", self._on_error)
                self.connection, self.sessions = None, self.runtime.sessions

    def _watch_group(self, context) -> None:
        if self.group is not None:
            self.group.lose_on_error(context)

    def transaction(self, work: Callable[[Session], Any], *, ack: bool = False) -> Any:
        """`work(session)` in a short transaction of the run: its lock waits end with the run, and lock
        conflicts are retried while the run has time (outbox.core.lock_wait). An ack waits once: if
        another transaction holds its rows that long, the attempt fails, naming the wait, and that
        failure's record is what waits on (until the run's end)."""
        budget = self.budget
        deadline = None
        if budget is not None and budget.max_time is not None:
            deadline = time.monotonic() + max(budget.remaining(), 0.0)
        return in_transaction(self.sessions, work, deadline=deadline, before_attempt=self.bound_lock_waits,
                              retry_waits=not ack)

    def bound_lock_waits(self) -> None:
        """The server's lock wait on the held connection: no longer than the run has left."""
        if self.connection is not None and self.budget is not None:
            bound_lock_wait(self.connection, self.budget.remaining())
