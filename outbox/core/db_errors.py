"""What a database error means for cronbox: a lock conflict to retry, a lost connection to
reconnect, a server that cannot be reached at all. MySQL/MariaDB by error code, SQLite by message."""
from __future__ import annotations

from sqlalchemy.exc import DBAPIError, OperationalError

# MySQL error codes.
DEADLOCK, LOCK_WAIT_TIMEOUT = 1213, 1205
LOCK_CONFLICTS = {DEADLOCK, LOCK_WAIT_TIMEOUT}
CONNECTION_LOST = {2006, 2013, 2003, 2002, 1226, 1927, 1053, 4031}  # gone away, lost, can't connect, too many user connections, killed, shutdown, idle disconnect
SQLITE_BUSY = ("database is locked", "database table is locked")


def mysql_error_code(exc: BaseException) -> int | None:
    orig = getattr(exc, "orig", exc)
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def is_lock_conflict(exc: BaseException) -> bool:
    """Deadlock / lock wait timeout on MySQL, busy database on SQLite: retry the transaction."""
    if mysql_error_code(exc) in LOCK_CONFLICTS:
        return True
    return isinstance(exc, OperationalError) and any(s in str(exc.orig) for s in SQLITE_BUSY)


def is_connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if mysql_error_code(exc) in CONNECTION_LOST:
        return True
    text_ = str(getattr(exc, "orig", exc)).lower()
    return "lost connection" in text_ or "gone away" in text_ or "connection refused" in text_


def is_unreachable(exc: BaseException) -> bool:
    """The database cannot be reached at all (as opposed to a statement failing)."""
    text_ = str(getattr(exc, "orig", exc)).lower()
    return is_connection_lost(exc) or "can't connect" in text_ or "unable to open database" in text_
