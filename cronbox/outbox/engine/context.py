"""What a consumer or job receives.

`ctx.session` is opened on first use, inside a transaction the runner holds
open on its connection; the session only ever works in a SAVEPOINT of it
("create_savepoint" mode). The ack then runs in that same transaction and
commits the handler's writes with it, so they happen exactly once, and nothing
the handler does to its session can end the transaction early:

- `commit()` releases the savepoint: the writes so far are kept, and commit with the ack;
- `rollback()` and `close()` roll back to it: the writes since the last commit() are gone;
- the session stays usable after any of them (the next statement opens a new savepoint);
- a database error raised through it (a caught IntegrityError) leaves it failed until the
  handler calls rollback(): a handler that returns with it failed has a failed attempt,
  and nothing it wrote is kept.

`ctx.commit_now()` is the one way to commit before the ack (for records that must
outlive the attempt); the session then joins a new attempt transaction.

A handler whose session never began work on the connection (no statement, no object added:
`HandlerTransaction.began`) has no database effects to protect, which lets the runner
batch its ack (QuietAcks). Building the session is not using it: a host app's scope builds it
before the call, to serve it as the host's `db.session` (cronbox.web.hosting).

`savepoint=False` (the broker consumer, outbox.events.consume: nothing of cronbox's is written
before the handler that a rollback() could take with it, or it is written again) saves the
SAVEPOINT statement: the session joins the attempt's transaction itself, so `rollback()` and
`close()` roll the whole transaction back (the same writes a savepoint would lose: everything
since the start, as nothing was committed yet), and after the handler's first `commit()` it
switches to a savepoint per transaction, so a later rollback() keeps what commit() kept.

In a commit group (a grouped handler: outbox.engine.group_commit.CommitGroup) the transaction is the group's,
shared by consecutive grouped items: the session's savepoint is the handler's own, kept on
success (left open: its writes commit with the group) and rolled back on failure. A handler that
called commit() has released its savepoint, so a later failure of its own takes the group with
it (`HandlerSession.released`); commit_now() is refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Transaction
from sqlalchemy.exc import DBAPIError, PendingRollbackError
from sqlalchemy.orm import Session

from cronbox.outbox.core.errors import TransactionAborted
from cronbox.outbox.core.server import transaction_aborted

from cronbox.outbox.core.text import describe


@dataclass(frozen=True)
class Event:
    """What a consumer receives: the recorded event, frozen. `id` is the event row's (on a message `amqp
    consume` took, the publisher's `x-event-id` header, or None); `payload` is the JSON value given to
    `record()`; `created_at` is naive UTC."""

    id: int
    type: str
    key: str | None
    payload: Any
    created_at: datetime


class HandlerSession(Session):
    """ctx.session: a Session in a savepoint of the attempt's transaction that remembers a database
    error until it is rolled back (MySQL and SQLite undo only the failed statement, so without this
    a handler's half-done writes would commit)."""

    def __init__(self, transaction: HandlerTransaction, savepoint: bool = True):
        super().__init__(bind=transaction.connection,
                         join_transaction_mode="create_savepoint" if savepoint else "rollback_only",
                         expire_on_commit=False)
        self.attempt_transaction = transaction
        self.failed_with: str | None = None
        self.released = False  # the handler called commit(): its writes so far left its savepoint

    def _watch(self, call, args, kwargs):
        try:
            return call(*args, **kwargs)
        except DBAPIError as exc:
            self.failed_with = describe(exc.orig or exc, 500)
            raise

    def commit(self) -> None:
        if self.failed_with is not None:
            # Failed until rollback(), on every backend: PostgreSQL refuses the RELEASE of a transaction
            # the error aborted, and keeping half of the writes on MySQL would be worse. SQLAlchemy's own
            # answer to a commit after a failed flush.
            raise PendingRollbackError(f"ctx.session failed on a database error ({self.failed_with}); "
                                       "call ctx.session.rollback() before commit()")
        self.released = True
        super().commit()
        # Joined without a savepoint, a rollback() would now also undo what this commit() kept.
        self.join_transaction_mode = "create_savepoint"

    def close(self) -> None:
        """The handler's close(): its uncommitted writes are gone, as with a savepoint."""
        if self.join_transaction_mode == "rollback_only" and self.in_transaction():
            self.rollback()
        super().close()

    def end(self) -> None:
        """cronbox's own close, after the attempt's transaction was committed or rolled back."""
        super().close()

    def execute(self, *args, **kwargs):
        return self._watch(super().execute, args, kwargs)

    def scalar(self, *args, **kwargs):
        return self._watch(super().scalar, args, kwargs)

    def scalars(self, *args, **kwargs):
        return self._watch(super().scalars, args, kwargs)

    def flush(self, *args, **kwargs):
        return self._watch(super().flush, args, kwargs)


@event.listens_for(HandlerSession, "after_transaction_create")
def _begin_attempt_transaction(session: HandlerSession, transaction) -> None:
    """The session is about to work: open the attempt's transaction first, so the session joins it
    with a savepoint instead of starting (and committing) one of its own. Lazily, so that SQLite's
    write lock (BEGIN IMMEDIATE) is not held before the handler writes."""
    if transaction.parent is None:
        session.attempt_transaction.begin()


@event.listens_for(HandlerSession, "after_soft_rollback")
def _forget_failure(session: HandlerSession, previous_transaction) -> None:
    """rollback(), close() or a begin_nested() block the error left: the failed work is undone."""
    session.failed_with = None


class HandlerTransaction:
    """The attempt's transaction on the run's connection: the handler's savepoints, then the ack.
    With a `commit_group`, the transaction is the group's (begun by the first member that writes)."""

    def __init__(self, connection: Connection, commit_group=None, *, savepoint: bool = True):
        self.connection = connection
        self.commit_group = commit_group
        self.outer: Transaction | None = None
        self.committed: list[Transaction] = []  # attempt transactions committed (commit_now, then the last)
        self.began = False  # the attempt's work on the connection started (the session's, or the caller's)
        self.session = HandlerSession(self, savepoint=savepoint or commit_group is not None)

    def begin(self) -> None:
        self.began = True
        if self.commit_group is not None:
            self.commit_group.begin()
        elif not self.connection.in_transaction():
            self.outer = self.connection.begin()

    def keep(self) -> None:
        """In a commit group: the handler succeeded; flush its pending writes and leave its savepoint open
        (the group's COMMIT ends it with the rest: a RELEASE would cost a round trip per item). The
        session is dropped, not closed: closing would roll back to its savepoint."""
        self.session.flush()

    def commit(self) -> None:
        """Commit the handler's writes and whatever the runner added through `session` (the ack).
        COMMIT keeps the savepoint still open, so no RELEASE round trip is needed."""
        try:
            self.session.flush()
            if self.outer is not None and self.outer.is_active:
                if transaction_aborted(self.connection):  # an error the handler caught on PostgreSQL
                    raise TransactionAborted("the database aborted the attempt's transaction after an error the "
                                             "handler caught; nothing of it was kept")
                self.outer.commit()
                self.committed.append(self.outer)
        finally:
            self.session.end()  # usable again: its next statement opens a new attempt transaction

    def discard(self, *, invalidate: bool = False) -> None:
        """Roll back everything; `invalidate` drops the connection (after a timeout interrupted it
        mid-query, it must not be used again)."""
        try:
            if invalidate:
                self.connection.invalidate()
            if self.outer is not None and self.outer.is_active:
                self.outer.rollback()
        finally:
            self.session.end()


class Context:
    """What a consumer or job receives beside its event or payload (a scheduled task gets its own,
    with `slot`, `trace_id` and `session`).

    - `attempt`: this attempt's number, from 1;
    - `trace_id`: the id the logs, the failed-job list and forwarded messages carry;
    - `idempotency_key`: stable over the retries of one delivery or job (give it to outside services,
      whose effects are at least once);
    - `session`: a SQLAlchemy session whose writes commit together with the ack, exactly once;
    - `commit_now()`: commit what `session` wrote so far at once (at least once);
    - `batch`: a job's batch (a member's, to `add()` more members; a batch callback's, to read its
      `progress()` and page its members' `results()`), else None;
    - `previous`: a chain step's previous step's result (None for the first step, and outside chains).
    """

    def __init__(self, *, attempt: int, trace_id: str, idempotency_key: str, connection: Connection,
                 settings=None, commit_group=None, savepoint: bool = True):
        self.attempt = attempt
        self._savepoint = savepoint  # HandlerTransaction's: False only where nothing precedes the handler
        self.settings = settings  # the run's Settings (channels read their configuration here)
        self.trace_id = trace_id
        self.idempotency_key = idempotency_key
        self._connection = connection
        self._commit_group = commit_group
        self._transaction: HandlerTransaction | None = None
        self.batch: Any = None  # jobs (issue 39): outbox.queue.batches.Batch
        self.previous: Any = None  # jobs (issue 39): a chain step's previous result

    @property
    def connection(self) -> Connection:
        """The run's connection the attempt works on: for cronbox's own reads before the call (a sealed
        payload's install id, outbox.core.sealing). A handler writes through `session`."""
        return self._connection

    @property
    def session(self) -> Session:
        """The attempt's session, in a savepoint of the transaction that carries the ack: its writes
        commit with the ack or not at all (`commit()` releases the savepoint, `rollback()` undoes the
        writes since the last one). In a host app, Flask-SQLAlchemy's `db.session` is this session."""
        if self._transaction is None:
            self._transaction = HandlerTransaction(self._connection, self._commit_group, savepoint=self._savepoint)
        return self._transaction.session

    @property
    def session_used(self) -> bool:
        """Did the handler's work begin on the connection? Its session ran a statement or took an
        object (SQLAlchemy begins the session's transaction then, and HandlerTransaction.begin with
        it), or the caller began the attempt itself (Context.begin). False for a session that was
        only built or handed out: its handler wrote nothing, so its ack may be batched."""
        return self._transaction is not None and self._transaction.began

    @property
    def transaction(self) -> HandlerTransaction | None:
        """The attempt's transaction once its work began (see session_used); None while the handler
        has not touched the connection, which a timeout or a failure then need not roll back."""
        return self._transaction if self.session_used else None

    def begin(self) -> HandlerTransaction:
        """Begin the attempt's transaction now, before the handler runs: the broker consumer writes
        its inbox row in it first (outbox.events.consume)."""
        self.session  # noqa: B018  (builds the attempt's HandlerTransaction)
        transaction = self._transaction
        assert transaction is not None  # self.session made it
        transaction.begin()
        return transaction

    def commit_now(self) -> None:
        """Commit what ctx.session wrote so far for good, now, without waiting for the ack: for records
        that must outlive a failed or killed attempt (the channels' send log, written before each
        network call). Those writes are then at-least-once, not exactly-once."""
        if self._commit_group is not None:
            raise RuntimeError("ctx.commit_now() is not available to a grouped handler (grouped=True): its writes "
                               "commit with its group")
        transaction = self.transaction
        if transaction is not None:
            if transaction.session.failed_with is not None:
                raise RuntimeError("ctx.session failed on a database error; call ctx.session.rollback() first")
            transaction.commit()

    def discard_session(self, *, invalidate: bool = False) -> None:
        """Roll back the handler's writes (see HandlerTransaction.discard). `invalidate` applies only
        where the handler's work began: a handler that never touched the connection cannot have
        left it mid-query."""
        if self._transaction is not None:
            transaction, self._transaction = self._transaction, None
            transaction.discard(invalidate=invalidate and transaction.began)

    def __repr__(self) -> str:
        return f"Context(attempt={self.attempt}, trace_id={self.trace_id!r}, idempotency_key={self.idempotency_key!r})"
