"""A host app's handlers (consumers, jobs, scheduled tasks): inside its app context, on the
handler's connection, in cron processes and in web ticks alike.

While a handler runs, a fresh app context of the host app is pushed (so `current_app`, `g`
and the host's extensions work as in a request), and the host's Flask-SQLAlchemy
`db.session` *is* the handler's `ctx.session`: `Model.query`, `db.session.add()` and
`ctx.session` write on one connection, in the savepoint of the attempt's transaction. They
commit once, with the ack, or roll back together on a failed attempt; `db.session.commit()`
keeps the writes for that ack (it releases the savepoint), exactly as `ctx.session.commit()`
does. A scheduled task's ctx.session is a plain session committed when the task succeeds, so
there `db.session` is that one. Outside handlers `db.session` is the host's own.

With cronbox's own connection (one, plus one for the run lock) doing all the work, a cron
process never opens the host's pool; connections the host's factory left in it are closed.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

from flask import Flask

_handler_ctx: ContextVar[Any] = ContextVar("cronbox_handler_ctx", default=None)


class HostScope:
    """runtime.handler_scope for a host app (see the module docstring)."""

    def __init__(self, app: Flask, db: Any = None):
        self.app = app
        self.db = db
        if db is not None:
            _serve_handler_sessions(db)

    @contextmanager
    def __call__(self, ctx) -> Iterator[None]:
        with self.app.app_context():
            token = _handler_ctx.set(ctx)
            try:
                yield
            finally:
                _handler_ctx.reset(token)
                if self.db is not None:
                    # Forget, never close: closing ctx.session here would roll back the handler's
                    # writes before the ack commits them (Flask-SQLAlchemy's teardown closes what
                    # is still registered when the app context ends).
                    self.db.session.registry.clear()


def _serve_handler_sessions(db: Any) -> None:
    """Make `db.session` hand out the running handler's ctx.session (once per `db`)."""
    registry = db.session.registry
    if getattr(registry.createfunc, "_cronbox_bound", False):  # the mark is on the function: the
        return  # registry (ScopedRegistry/ThreadLocalRegistry) has __slots__ and takes no attribute
    original = registry.createfunc

    def create():
        # ctx.session is built on first use, so a handler that never touches either session keeps
        # its cheap batched ack.
        ctx = _handler_ctx.get()
        return ctx.session if ctx is not None else original()

    create._cronbox_bound = True
    registry.createfunc = create


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
