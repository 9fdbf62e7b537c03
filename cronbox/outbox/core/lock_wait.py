"""How long a run's statements wait for a lock another transaction holds: never past the run's end.

A lock wait is invisible from inside: the statement just blocks, for MariaDB's
innodb_lock_wait_timeout (50 s by default) or SQLite's busy_timeout (30 s here), and the retries
of lock conflicts (outbox.core.transactions.in_transaction) multiply it. A handler that writes cronbox's
tables on a connection of its own and keeps that transaction open blocks the ack of its item that
way for as long as it lives; a host's long transaction does the same for a while. So before its
writes a run bounds the wait on its own connection to LOCK_WAIT_SLICE, and to the run's remaining
time when less is left (`bound_lock_wait`: `SET SESSION innodb_lock_wait_timeout, lock_wait_timeout`, allowed on
shared hosts, or `PRAGMA busy_timeout`; sent only when the bound changes, so at most once per
connection and about once a second in a run's last seconds). Each slice that ends in a conflict is
logged and retried while the run has time; then the item's attempt fails with a reason that names
the lock wait (`lock_wait_error`).

Not only a batch's writes: while a run lasts (`run_lock_waits`, around a command's run), every
connection it takes gets the bound before its first statement (the schema check, the heartbeat, the
claims, fan-out, scheduler slots, one-off rows, prunes), and the relay's and worker's claims retry
only while the run has time. A conflict that still escapes a stage stops the run as `lock-wait`
(outbox.engine.run_loop), exit 0, with one line naming what waited.

The bound is set through the DB-API connection, outside SQLAlchemy's transaction handling: on
SQLite a statement through SQLAlchemy would begin a transaction (BEGIN IMMEDIATE), which itself
waits for the lock. A web process's pooled connections get their server default back when they
return to the pool (`restore_on_return`); a cron process's one connection keeps the run's bound to
its end (the run's last writes, the heartbeat, are bounded the same way).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DisconnectionError

LOCK_WAIT_SLICE = 10  # seconds one statement of a run waits for a lock, at most
SQLITE_BUSY_MS = 30000  # the engine's busy_timeout (outbox.core.engines._sqlite_engine)
_BOUND = "cronbox_lock_wait"  # the bound set on a DB-API connection, in its pool record's info


def bound_lock_wait(connection: Connection, remaining: float) -> int:
    """Let a statement on `connection` wait at most LOCK_WAIT_SLICE seconds for a lock, and no longer
    than `remaining` (at least 1 s: the servers count whole seconds here). Returns the bound."""
    return _bound(connection.connection.dbapi_connection, connection.info, connection.dialect.name, remaining)


@contextmanager
def run_lock_waits(engine: Engine, remaining: Callable[[], float]) -> Iterator[None]:
    """While a run lasts, every connection it takes from `engine` waits for locks as `bound_lock_wait`
    says, before its first statement: the claims, fan-out, scheduler slots, one-off rows, prunes and
    the heartbeat, not only a batch's writes. A pool "checkout" listener (removed at the end), so the
    bound is sent once per connection and again only when the run's last seconds shorten it."""
    dialect = engine.dialect.name

    def bound(dbapi_connection, record, _proxy) -> None:
        try:
            _bound(dbapi_connection, record.info, dialect, remaining())
        except engine.dialect.loaded_dbapi.Error as exc:
            # A connection that died in the pool (a cut, the server gone): SQLAlchemy's documented answer
            # from a checkout listener is DisconnectionError, which invalidates it and checks out a fresh
            # one, whose connect error is then the ordinary, wrapped one the run's reconnects know.
            raise DisconnectionError(f"setting the run's lock wait failed: {exc}") from exc

    event.listen(engine, "checkout", bound)
    try:
        yield
    finally:
        event.remove(engine, "checkout", bound)


def _bound(dbapi_connection, info: dict, dialect: str, remaining: float) -> int:
    seconds = LOCK_WAIT_SLICE if remaining >= LOCK_WAIT_SLICE else max(1, math.ceil(remaining))  # inf: no --max-time
    if info.get(_BOUND) != seconds:
        if _set(dbapi_connection, dialect, seconds):
            info[_BOUND] = seconds
    return seconds


def restore_on_return(dbapi_connection, record, reset_state) -> None:
    """A pool "reset" listener (web engines): a connection a run bounded gets its default wait back."""
    if record.info.pop(_BOUND, None) is not None and not reset_state.terminate_only:
        _set(dbapi_connection, _dialect_of(dbapi_connection), None)


def _set(dbapi_connection, dialect: str, seconds: int | None) -> bool:
    """Send the bound; True when it holds for the connection's next transactions too.

    PostgreSQL's SET is transactional: inside a transaction that then rolls back it is undone. So
    outside a transaction the SET is committed at once; inside one (an ack after a handler's writes)
    it is SET LOCAL, for that transaction alone, and not remembered, so the next bound is sent again."""
    if dialect == "postgresql":
        from psycopg.pq import TransactionStatus  # a PostgreSQL engine has loaded psycopg already

        idle = dbapi_connection.info.transaction_status == TransactionStatus.IDLE
        with dbapi_connection.cursor() as cursor:
            if seconds is None:
                cursor.execute("RESET lock_timeout")
            else:
                cursor.execute(f"SET {'' if idle else 'LOCAL '}lock_timeout = '{int(seconds)}s'")
        if idle:
            dbapi_connection.commit()
        return idle
    cursor = dbapi_connection.cursor()
    try:
        if dialect == "sqlite":
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS if seconds is None else seconds * 1000}")
        else:
            # Row locks wait for innodb_lock_wait_timeout, table locks (another session's LOCK TABLES
            # ... WRITE, a DDL) for lock_wait_timeout, a day by default: both, in one statement.
            value = "DEFAULT" if seconds is None else int(seconds)
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {value}, lock_wait_timeout = {value}")
    finally:
        cursor.close()
    return True


def _dialect_of(dbapi_connection) -> str:
    module = type(dbapi_connection).__module__
    return "sqlite" if module.startswith("sqlite3") else "postgresql" if module.startswith("psycopg") else "mysql"


def lock_wait_error(what: str, waited: float) -> str:
    """The error an item's attempt ends with when its write could not get a lock in time."""
    return (f"lock wait: {what} waited {waited:.0f}s for a lock held by another transaction "
            "(did the handler write cronbox tables on its own connection?)")
