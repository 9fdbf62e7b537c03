"""A host app's handlers (consumers, jobs, scheduled tasks): inside its app context, on the
handler's connection, in cron processes and in web ticks alike.

While a handler runs, a fresh app context of the host app is pushed (so `current_app`, `g`
and the host's extensions work as in a request), and the host's Flask-SQLAlchemy
`db.session` *is* the handler's `ctx.session`: `Model.query`, `db.session.add()` and
`ctx.session` write on one connection, in the savepoint of the attempt's transaction. They
commit once, with the ack, or roll back together on a failed attempt; `db.session.commit()`
keeps the writes for that ack (it releases the savepoint), exactly as `ctx.session.commit()`
does. A scheduled task's ctx.session is a plain session committed when the task succeeds, so
there `db.session` is that one. Outside handlers `db.session` is the host's own: cronbox changes
nothing of the host's `db` (no factory replaced), it only registers the handler's session for the
app context it pushes. (A handler that calls `db.session.remove()` ends that registration: the
next `db.session` is then a host session of its own, outside the attempt; `close()` keeps it.)

With cronbox's own connection (one, plus one for the run lock) doing all the work, a cron
process never opens the host's pool; connections the host's factory left in it are closed.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from flask import Flask


class HostScope:
    """runtime.handler_scope for a host app (see the module docstring).

    The handler's session is put in the host's session registry for the pushed app context alone,
    through the registry's public `set()` and `clear()` (SQLAlchemy's ScopedRegistry, keyed by
    Flask-SQLAlchemy on the app context): the host's `db.session` object, its registry and its
    factory stay the host's own, and any other app context (a request, a second one the handler
    pushes) gets the host's own session as always. Building ctx.session here does not count as
    using it: a handler that never touches either session keeps its batched ack
    (outbox.engine.context.Context.session_used)."""

    def __init__(self, app: Flask, db: Any = None):
        self.app = app
        self.db = db

    @contextmanager
    def __call__(self, ctx) -> Iterator[None]:
        with self.app.app_context():
            if self.db is None:
                yield
                return
            registry = self.db.session.registry
            registry.set(ctx.session)
            try:
                yield
            finally:
                # Forget, never close: closing ctx.session here would roll back the handler's
                # writes before the ack commits them (Flask-SQLAlchemy's teardown closes what
                # is still registered when the app context ends).
                registry.clear()


def host_engines(app: Flask, db: Any) -> list:
    """The host's Flask-SQLAlchemy engines (none without `db`)."""
    if db is None:
        return []
    with app.app_context():
        return list(db.engines.values())


def close_host_pools(app: Flask, db: Any) -> None:
    """Close the connections the host's factory left in its pools: a cron process works on cronbox's."""
    for engine in host_engines(app, db):
        engine.dispose()
