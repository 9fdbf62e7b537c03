"""Waking a lingering run when work arrives: PostgreSQL's LISTEN/NOTIFY.

A lingering tick or worker looks for due work about once a second (outbox.engine.run_loop). On
PostgreSQL it also listens: migration 0012's trigger sends `NOTIFY cronbox, '<table>'` in every
transaction that inserts into cronbox_events or cronbox_jobs (record(), dispatch(), a forwarded
retry), which the server delivers at COMMIT, and only then, to the sessions listening at that
moment. The run waits on the listening connection's socket instead of sleeping, so work committed
while it waits starts within milliseconds, not up to a second later. A worker wakes only for jobs;
a tick for both tables.

Polling stays: a notification is a hint, never the only way to find work. One sent while nobody
listened (before LISTEN, between a lost connection and the next), one for a delayed job not due
yet, or one lost with a dropped connection only costs the old latency: the next poll finds the
rows. Without a listening connection the wait is a plain sleep, and LISTEN is tried again at most
every RETRY_LISTEN seconds, with one log line per outage. The listener lives on a connection the run
already holds in autocommit (the tick's lock connection), or on one of its own (a worker has no lock
connection). The wait is psycopg's public `Connection.notifies(timeout=, stop_after=)`; `LISTEN` is
plain SQL.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from cronbox.outbox.core.server import is_postgresql

log = logging.getLogger("cronbox")

CHANNEL = "cronbox"
RETRY_LISTEN = 5.0  # seconds between attempts to listen again after a failure (polling meanwhile)
ALL_TABLES = frozenset({"cronbox_events", "cronbox_jobs"})


class Listener:
    """LISTEN on the connection `connection()` returns now (it may change: a re-taken lock opens a
    new one, which is then listened on again), and wait for a notification about `tables` on it."""

    def __init__(self, connection: Callable[[], Connection | None], tables: frozenset[str] = ALL_TABLES):
        self._connection = connection
        self._tables = tables
        self._listening = None  # the DB-API connection LISTEN was sent on
        self._retry_at = 0.0  # time.monotonic() before which no new LISTEN is tried (after a failure)
        self._outage = False  # a failure was logged and nothing has listened since

    def listen(self) -> None:
        """LISTEN now, before the run looks for work (a NOTIFY committed earlier reached nobody)."""
        if self._listening is not None and not self._listening.closed:
            current = self._connection()
            if current is not None and current.connection.dbapi_connection is self._listening:
                return
        if time.monotonic() < self._retry_at:
            return
        connection = self._connection()
        if connection is None:
            self._failed("no connection")
            return
        try:
            connection.execute(text(f"LISTEN {CHANNEL}"))
        except Exception as exc:  # the connection's owner (the lock's check) notices too, and says so
            self._failed(type(exc).__name__)
            return
        self._listening = connection.connection.dbapi_connection
        if self._outage:
            log.info("listen: listening again; polling stays behind it")
            self._outage = False

    def wait(self, seconds: float) -> bool:
        """Up to `seconds` for a notification; True when one came (the rest queued are taken too).
        Without a listening connection, a plain sleep: polling goes on."""
        self.listen()
        dbapi = self._listening
        if dbapi is None:
            time.sleep(seconds)
            return False
        try:
            woken = any(n.payload in self._tables for n in dbapi.notifies(timeout=seconds, stop_after=1))
            for n in dbapi.notifies(timeout=0):  # more that came at once: one wake-up is enough
                woken = woken or n.payload in self._tables
            return woken
        except Exception as exc:  # a dropped connection: polling goes on; LISTEN again on the next one
            self._failed(type(exc).__name__)
            return False

    def _failed(self, reason: str) -> None:
        self._listening = None
        self._retry_at = time.monotonic() + RETRY_LISTEN
        if not self._outage:
            log.warning("listen: not listening (%s); polling until it is back", reason)
            self._outage = True


def own_listener(engine: Engine, tables: frozenset[str] = ALL_TABLES) -> tuple[Listener, Callable[[], None]] | None:
    """A listener on a connection of its own (a worker's), and the call that closes it; None unless
    `engine` is PostgreSQL. The connection comes from `engine` (a lock engine: no pool), in autocommit,
    and is kept open however long it idles (idle_session_timeout, 14+): listening is its whole job."""
    if not is_postgresql(engine):
        return None
    held: list[Connection] = []

    def connection() -> Connection | None:
        if held and (held[0].closed or held[0].invalidated or held[0].connection.dbapi_connection.closed):
            held[0].invalidate()  # its socket is gone (psycopg's `closed`): a new one for the next LISTEN
            held.clear()
        if not held:
            try:
                fresh = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            except Exception:
                return None  # Listener.listen says so, once
            try:
                if (fresh.dialect.server_version_info or (0,)) >= (14,):
                    fresh.execute(text("SET idle_session_timeout = 0"))
            except Exception:
                fresh.close()
                return None
            held.append(fresh)
        return held[0]

    def close() -> None:
        for each in held:
            try:
                each.close()
            except Exception:  # already gone with the server or the network: nothing left to close
                pass
        held.clear()

    return Listener(connection, tables), close
