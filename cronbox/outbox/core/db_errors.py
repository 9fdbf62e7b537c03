"""What a database error means for cronbox: a lock conflict to retry, a lost connection to
reconnect, a server that cannot be reached at all. MySQL/MariaDB by error code, PostgreSQL by
SQLSTATE (psycopg's public `sqlstate`), SQLite by message."""
from __future__ import annotations

from sqlalchemy.exc import DBAPIError, OperationalError, PendingRollbackError

# MySQL error codes.
DEADLOCK, LOCK_WAIT_TIMEOUT = 1213, 1205
LOCK_CONFLICTS = {DEADLOCK, LOCK_WAIT_TIMEOUT}
CONNECTION_LOST = {2006, 2013, 2003, 2002, 1226, 1927, 1053, 4031}  # gone away, lost, can't connect, too many user connections, killed, shutdown, idle disconnect
SQLITE_BUSY = ("database is locked", "database table is locked")
# PostgreSQL SQLSTATEs: deadlock, lock_timeout expired (lock_not_available), serialization failure.
PG_LOCK_CONFLICTS = {"40P01", "55P03", "40001"}
PG_DEADLOCK = "40P01"
# Connection exceptions (08...), too many connections, terminated by an administrator or a crash,
# the server starting up or shutting down: a connection to make again later.
PG_CONNECTION_LOST = {"53300", "57P01", "57P02", "57P03"}


def pg_sqlstate(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", exc)
    state = getattr(orig, "sqlstate", None)
    return state if isinstance(state, str) else None


def mysql_error_code(exc: BaseException) -> int | None:
    orig = getattr(exc, "orig", exc)
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def error_code(exc: BaseException) -> int | str | None:
    """The server's code for a log line: MySQL's number or PostgreSQL's SQLSTATE."""
    return mysql_error_code(exc) or pg_sqlstate(exc)


def is_deadlock(exc: BaseException) -> bool:
    return mysql_error_code(exc) == DEADLOCK or pg_sqlstate(exc) == PG_DEADLOCK


def is_lock_conflict(exc: BaseException) -> bool:
    """Deadlock / lock wait timeout on MySQL and PostgreSQL, busy database on SQLite: retry the transaction."""
    if mysql_error_code(exc) in LOCK_CONFLICTS or pg_sqlstate(exc) in PG_LOCK_CONFLICTS:
        return True
    return isinstance(exc, OperationalError) and any(s in str(exc.orig) for s in SQLITE_BUSY)


# What a lost connection can be raised as: the driver's error, or SQLAlchemy's PendingRollbackError for a
# statement on a Connection whose connection was lost inside a transaction not yet rolled back (its
# documented error code 8s2b; a Session's PendingRollbackError after a failed flush, 7s2a, is not a lost
# connection).
CONNECTION_ERRORS = (DBAPIError, PendingRollbackError)
INVALIDATED_IN_TRANSACTION = "8s2b"


def is_connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, PendingRollbackError):
        return exc.code == INVALIDATED_IN_TRANSACTION
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if mysql_error_code(exc) in CONNECTION_LOST:
        return True
    state = pg_sqlstate(exc)
    if state is not None and (state in PG_CONNECTION_LOST or state.startswith("08")):
        return True
    text_ = str(getattr(exc, "orig", exc)).lower()
    return any(sign in text_ for sign in ("lost connection", "gone away", "connection refused",
                                          "server closed the connection", "connection is closed",
                                          "terminating connection", "consuming input failed"))


def is_unreachable(exc: BaseException) -> bool:
    """The database cannot be reached at all (as opposed to a statement failing)."""
    text_ = str(getattr(exc, "orig", exc)).lower()
    return (is_connection_lost(exc) or "can't connect" in text_ or "unable to open database" in text_
            or "could not connect" in text_ or "connection failed" in text_)
