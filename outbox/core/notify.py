"""Waking a lingering run when work arrives: PostgreSQL's LISTEN/NOTIFY.

A lingering tick or worker looks for due work about once a second (outbox.engine.run_loop). On
PostgreSQL it also listens: migration 0012's trigger sends `NOTIFY cronbox` in every transaction
that inserts into cronbox_events or cronbox_jobs (record(), dispatch(), a forwarded retry), which
the server delivers at COMMIT, and only then, to the sessions listening at that moment. The run
waits on the listening connection's socket instead of sleeping, so work committed while it waits
starts within milliseconds, not up to a second later.

Polling stays: a notification is a hint, never the only way to find work. One sent while nobody
listened (before LISTEN, between a lost connection and the next), one for a delayed job not due
yet, or one lost with a dropped connection only costs the old latency: the next poll finds the
rows. The listener lives on a connection the run already holds in autocommit (the tick's lock
connection), or on one of its own (a worker has no lock connection). The wait is psycopg's public
`Connection.notifies(timeout=, stop_after=)`; `LISTEN` is plain SQL.
"""
from __future__ import annotations

import logging
from typing import Callable

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from cronbox.outbox.core.server import is_postgresql

log = logging.getLogger("cronbox")

CHANNEL = "cronbox"


class Listener:
    """LISTEN on the connection `connection()` returns now (it may change: a re-taken lock opens a
    new one, which is then listened on again), and wait for a notification on it."""

    def __init__(self, connection: Callable[[], Connection | None]):
        self._connection = connection
        self._listening = None  # the DB-API connection LISTEN was sent on
        self.broken = False

    def listen(self) -> None:
        """LISTEN now, before the run looks for work (a NOTIFY committed earlier reached nobody)."""
        connection = self._connection()
        if connection is None:
            return
        dbapi = connection.connection.dbapi_connection
        if dbapi is self._listening:
            return
        try:
            connection.execute(text(f"LISTEN {CHANNEL}"))
        except Exception as exc:  # the connection's owner (the lock's check) notices and says so
            log.warning("listen: could not LISTEN (%s); polling only", type(exc).__name__)
            self._listening = None
            return
        self._listening = dbapi

    def wait(self, seconds: float) -> bool:
        """Up to `seconds` for a notification; True when one came (the rest queued are taken too)."""
        self.listen()
        dbapi = self._listening
        if dbapi is None:
            return False
        try:
            woken = any(True for _ in dbapi.notifies(timeout=seconds, stop_after=1))
            if woken:
                for _ in dbapi.notifies(timeout=0):  # more that came at once: one wake-up is enough
                    pass
            return woken
        except Exception as exc:  # a dropped connection: polling goes on; LISTEN again on the next one
            log.warning("listen: the listening connection failed (%s); polling until it is back",
                        type(exc).__name__)
            self._listening = None
            return False


def own_listener(engine: Engine) -> tuple[Listener, Callable[[], None]] | None:
    """A listener on a connection of its own (a worker's), and the call that closes it; None unless
    `engine` is PostgreSQL. The connection comes from `engine` (a lock engine: no pool), in autocommit."""
    if not is_postgresql(engine):
        return None
    held: list[Connection] = []

    def connection() -> Connection | None:
        if held and (held[0].closed or held[0].invalidated or held[0].connection.dbapi_connection.closed):
            held[0].invalidate()  # its socket is gone (psycopg's `closed`): a new one for the next LISTEN
            held.clear()
        if not held:
            try:
                held.append(engine.connect().execution_options(isolation_level="AUTOCOMMIT"))
            except Exception as exc:
                log.warning("listen: could not connect (%s); polling only", type(exc).__name__)
                return None
        return held[0]

    def close() -> None:
        for each in held:
            each.close()
        held.clear()

    return Listener(connection), close
