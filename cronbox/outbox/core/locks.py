"""Named exclusive locks for runs that must not overlap (tick, migrate, rewrap, ...).

MySQL/MariaDB: GET_LOCK on a dedicated connection held for the whole run.
GET_LOCK names are server-wide (other tenants share the namespace), so they
are prefixed with the database name; the server releases the lock silently
when the connection dies, including when it idles past wait_timeout, so the
lock connection raises its own SESSION wait_timeout above the run's length and
the run checks `IS_USED_LOCK(name) = CONNECTION_ID()` before each batch.

PostgreSQL: a session-level advisory lock, `pg_try_advisory_lock(key)`, the same way: a dedicated
connection in autocommit (a session lock outlives transactions; a transaction-level one would end
with the first commit), released by the server when that connection ends, checked before each batch
in `pg_locks` (ours: this backend's pid). The key is a 64-bit hash of the same name; advisory locks
are per database, so other tenants cannot collide. Idle connections are not closed by default
(idle_session_timeout, 14+, is 0), and TCP keepalives (outbox.core.engines) notice a dead peer.

SQLite: an flock()-based file lock in <instance>/locks/; the kernel releases it
when the process dies, even under SIGKILL.
"""
from __future__ import annotations

import hashlib
import logging
import os
import stat

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import is_connection_lost
from cronbox.outbox.core.errors import LockLost
from cronbox.outbox.core.server import database_name, is_mysql, is_postgresql
from cronbox.outbox.core.settings import Settings

log = logging.getLogger("cronbox")

MAX_LOCK_NAME = 64  # MySQL refuses longer GET_LOCK names
# A lock taken or found held this many seconds ago counts as held without asking the server again:
# the stages of one pass of the run loop check it in turn within milliseconds (a quiet tick: three
# IS_USED_LOCK round trips right after its GET_LOCK). A lock lost in that moment is noticed at the
# next check after it, a batch later at most; claims are leased, so an overlapping run is safe
# meanwhile, as it is in the moment between any check and the batch after it.
CONFIRMED_FOR = 0.5
_ABANDONED: list[Connection] = []  # a forked child's copies of its parent's lock connections (abandon())
SOCKETS = "cronbox_lock_sockets"  # Connection.info key: the socket descriptors its DBAPI connection opened


def lock_name(database: str, purpose: str) -> str:
    name = f"{database}:{purpose}"
    if len(name) <= MAX_LOCK_NAME:
        return name
    digest = hashlib.sha256(database.encode()).hexdigest()[:16]
    return f"cronbox-{digest}:{purpose}"[:MAX_LOCK_NAME]


class ServerLock:
    """A server's named lock on its own connection, or on a borrowed one: a command run inside the
    tick takes its lock on the tick's lock connection (both servers allow several named locks per
    connection), so a one-off `migrate` costs no third connection. The subclasses say the SQL."""

    def __init__(self, engine: Engine, purpose: str, *, hold_seconds: int, borrowed: Connection | None = None):
        self.engine = engine
        self.name = lock_name(database_name(engine), purpose)
        self.hold_seconds = max(int(hold_seconds), 60)
        self.borrowed = borrowed
        self.connection: Connection | None = None
        self._confirmed_at = float("-inf")  # clock.monotonic() when the server last said it is ours

    def _take(self) -> bool:
        if self.borrowed is not None:
            got = self._try(self.borrowed)
            self.connection = self.borrowed if got else None
            if got:
                self._confirmed_at = clock.monotonic()
            return got
        before = socket_descriptors()
        connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        opened = {fd: identity for fd, identity in socket_descriptors().items() if before.get(fd) != identity}
        if opened:  # a new DBAPI connection: its socket, for abandon() in a forked child
            connection.info[SOCKETS] = opened
        try:
            self._keep_alive(connection)
            got = self._try(connection)
        except Exception:
            connection.close()
            raise
        if got:
            self.connection = connection
            self._confirmed_at = clock.monotonic()
            return True
        connection.close()
        return False

    def acquire(self) -> bool:
        return self._take()

    def held(self) -> bool:
        if self.connection is None:
            return False
        if clock.monotonic() - self._confirmed_at < CONFIRMED_FOR:
            return True
        try:
            owned = self._owned(self.connection)
        except Exception as exc:  # killed connection, restarted server: the lock is gone with it
            log.warning("lock %s: connection lost (%s)", self.name, type(exc).__name__)
            self._discard()
            return False
        if owned:
            self._confirmed_at = clock.monotonic()
        return owned

    def retake(self) -> bool:
        if self.borrowed is not None:
            return False  # the owner of the connection re-takes its own lock; ours died with it
        self._discard()
        try:
            return self._take()
        except DBAPIError as exc:
            if is_connection_lost(exc):
                # The server is out of reach, so nobody can say whether another run holds the lock:
                # the run waits it out like any lost connection and asks again (GET_LOCK(name, 0)).
                raise
            log.warning("lock %s: could not reconnect to re-take it (%s)", self.name, type(exc).__name__)
            return False

    def release(self) -> None:
        if self.connection is None:
            return
        try:
            self._give_back(self.connection)
        except Exception:
            pass  # the lock died with the connection anyway
        self._discard()

    def abandon(self) -> None:
        """In a forked child: let go of this process's copy of the lock connection without a word to
        the server (no RELEASE_LOCK, no QUIT: the lock is the parent's). Only the child's descriptor of
        the socket is closed, so the lock lives and dies with the parent's connection alone, also when
        the parent is SIGKILLed while the child still runs.

        Neither driver (PyMySQL, psycopg) has a public call that closes a connection's socket without a word to the server, nor one
        that names its socket, so the socket is known by the descriptors that appeared while the
        connection was made (_take: `SOCKETS` in Connection.info, kept for the DBAPI connection's
        life) and closed here with the operating system's calls (close_socket_copies)."""
        connection, self.connection = self.connection, None
        if connection is None or connection is self.borrowed:
            return
        # Kept for the life of the child: if the Connection were collected, its pool would reset it
        # (a ROLLBACK on the parent's socket) and close it.
        _ABANDONED.append(connection)
        try:
            sockets = connection.info.get(SOCKETS, {})
        except Exception:  # already invalidated: nothing of it is left open here
            return
        close_socket_copies(sockets)

    def _discard(self) -> None:
        self._confirmed_at = float("-inf")
        if self.connection is not None and self.connection is self.borrowed:
            self.connection = None
            return
        if self.connection is not None:
            try:
                self.connection.invalidate()
                self.connection.close()
            except Exception:
                pass
            self.connection = None

    # What each server says; `connection` is in autocommit (or the tick's borrowed lock connection).
    def _keep_alive(self, connection: Connection) -> None:
        raise NotImplementedError

    def _try(self, connection: Connection) -> bool:
        raise NotImplementedError

    def _owned(self, connection: Connection) -> bool:
        raise NotImplementedError

    def _give_back(self, connection: Connection) -> None:
        raise NotImplementedError


class MySQLLock(ServerLock):
    def _keep_alive(self, connection: Connection) -> None:
        # Survive long handlers and lingering: the server must not close this
        # idle connection (and silently drop the lock) before the run ends.
        connection.execute(text(f"SET SESSION wait_timeout = {self.hold_seconds}"))

    def _try(self, connection: Connection) -> bool:
        return connection.execute(text("SELECT GET_LOCK(:name, 0)"), {"name": self.name}).scalar() == 1

    def _owned(self, connection: Connection) -> bool:
        return connection.execute(text("SELECT IS_USED_LOCK(:name) = CONNECTION_ID()"),
                                  {"name": self.name}).scalar() == 1

    def _give_back(self, connection: Connection) -> None:
        connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": self.name})


class PostgresLock(ServerLock):
    @property
    def key(self) -> int:
        """The name as a signed 64-bit advisory lock key."""
        return int.from_bytes(hashlib.sha256(self.name.encode()).digest()[:8], "big", signed=True)

    def _keep_alive(self, connection: Connection) -> None:
        """The server notices a dead client within a minute (its own TCP keepalives: the lock of a
        crashed or cut-off host is not held for the kernel's two hours), and closes this connection if
        it idles longer than the run may last (idle_session_timeout, 14+), like MySQL's wait_timeout."""
        settings = {"tcp_keepalives_idle": "30", "tcp_keepalives_interval": "10", "tcp_keepalives_count": "3"}
        if (connection.dialect.server_version_info or (0,)) >= (14,):
            settings["idle_session_timeout"] = str(self.hold_seconds * 1000)
        connection.execute(text("SELECT " + ", ".join(f"set_config('{name}', :{name}, false)" for name in settings)),
                           settings)

    def _try(self, connection: Connection) -> bool:
        return connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": self.key}).scalar() is True

    def _owned(self, connection: Connection) -> bool:
        # pg_locks shows a bigint key as its high half in classid, its low half in objid, objsubid 1.
        key = self.key & 0xFFFFFFFFFFFFFFFF
        return connection.execute(text(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = pg_backend_pid() AND objsubid = 1 AND classid::bigint = :high AND objid::bigint = :low)"
        ), {"high": key >> 32, "low": key & 0xFFFFFFFF}).scalar() is True

    def _give_back(self, connection: Connection) -> None:
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.key})


class FileLock:
    def __init__(self, settings: Settings, purpose: str):
        import filelock  # here: only SQLite installations need it

        settings.private_dir("locks")
        self.name = purpose
        self.path = settings.locks_dir / f"{purpose}.lock"
        self._lock = filelock.FileLock(str(self.path), timeout=0, thread_local=False, mode=0o600)
        self._timeout = filelock.Timeout

    def acquire(self) -> bool:
        try:
            self._lock.acquire(timeout=0)
            return True
        except self._timeout:
            return False

    def held(self) -> bool:
        return self._lock.is_locked

    def retake(self) -> bool:
        return self.acquire()

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)

    def abandon(self) -> None:
        """In a forked child: nothing to do. filelock (4.3.1 and later, the floor in pyproject.toml)
        closes a child's copy of a held lock's descriptor after a fork and resets the lock object
        there, without unlocking: flock is released when the last descriptor of the open file goes,
        the parent's (tests/processes/test_pool.py kills a parent while its children run)."""


class RunLock:
    """What a run holds: acquire once, then `ensure()` before each batch."""

    def __init__(self, backend):
        self.backend = backend
        self.name = backend.name

    def acquire(self) -> bool:
        return self.backend.acquire()

    def ensure(self) -> bool:
        """True while the lock is ours; if it was lost, try once to take it back."""
        if self.backend.held():
            return True
        log.warning("lock %s was lost; trying to re-take it", self.name)
        if self.backend.retake():
            log.warning("lock %s re-taken", self.name)
            return True
        log.error("lock %s is lost and could not be re-taken", self.name)
        return False

    def check(self) -> None:
        """ensure(), raising LockLost when the lock is gone for good: call before each batch. A server
        out of reach raises its connection error instead (the run loop waits, then asks again)."""
        if not self.ensure():
            raise LockLost(f"lock {self.name} lost (connection killed or server restarted) and not re-taken; "
                           "stopped claiming")

    def release(self) -> None:
        self.backend.release()

    def abandon(self) -> None:
        """In a forked child: drop the inherited lock without releasing it (it stays the parent's)."""
        self.backend.abandon()

    @property
    def connection(self) -> Connection | None:
        """The server connection holding the lock (None on SQLite)."""
        return getattr(self.backend, "connection", None)


def socket_descriptors() -> dict[int, tuple[int, int]]:
    """This process's open socket descriptors, each with its identity (device, inode): what
    /proc/self/fd lists (Linux; elsewhere none are found, and abandon() closes nothing)."""
    found: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            fd = int(name)
            info = os.fstat(fd)
        except (ValueError, OSError):  # the listing's own descriptor, closed by now
            continue
        if stat.S_ISSOCK(info.st_mode):
            found[fd] = (info.st_dev, info.st_ino)
    return found


def close_socket_copies(sockets: dict[int, tuple[int, int]]) -> None:
    """Close this process's copy of each socket (nothing is sent: the other process's copy stays
    open and usable). Each descriptor still naming the same socket is pointed at /dev/null instead
    of freed, so that the number stays taken: the driver's socket object still holds it, and closing
    it later must not close an unrelated file that reused the number."""
    if not sockets:
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd, identity in sockets.items():
            try:
                info = os.fstat(fd)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) == identity:
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def run_lock(settings: Settings, lock_engine: Engine, purpose: str, *, hold_seconds: int = 3600,
             borrowed: Connection | None = None) -> RunLock:
    if is_mysql(lock_engine):
        return RunLock(MySQLLock(lock_engine, purpose, hold_seconds=hold_seconds, borrowed=borrowed))
    if is_postgresql(lock_engine):
        return RunLock(PostgresLock(lock_engine, purpose, hold_seconds=hold_seconds, borrowed=borrowed))
    return RunLock(FileLock(settings, purpose))
