"""A process's view of cronbox: settings, engine, sessions, handlers and locks.

Built once by each command (role "cron": one pooled connection, plus one for a
run lock) or by create_app() (role "web").
"""
from __future__ import annotations

import importlib
import threading
import logging
import sys
from typing import Any, Callable, ContextManager, Iterable

from sqlalchemy.engine import Engine

from cronbox.outbox.core.engines import make_engine, session_factory
from cronbox.outbox.core.errors import HandlerImportError, SettingsError
from cronbox.outbox.core.locks import RunLock, run_lock
from cronbox.outbox.core.logs import configure_logging
from cronbox.outbox.core.migrate import ensure_schema
from cronbox.outbox.core.server import is_mysql, is_postgresql, is_server, server_version, supports_skip_locked
from cronbox.outbox.core.settings import Settings, load_settings
from cronbox.outbox.engine import claim as claiming
from cronbox.outbox.engine.registry import DEFAULT, Registry

log = logging.getLogger("cronbox")
MIN_POSTGRESQL = 12  # the oldest release its project still supported when cronbox first ran on it


class Runtime:
    def __init__(self, settings: Settings, *, role: str = "cron", registry: Registry | None = None):
        self.settings = settings
        self.role = role
        settings.private_dir()  # logs, locks, keys and the run-once inbox live here, 0700
        self.engine: Engine = make_engine(settings, role=role)
        self.sessions = session_factory(self.engine)
        # What the handler modules registered (consumers, jobs, tasks): the process's default unless
        # the caller brings its own (tests, a second app in one process).
        self.registry = registry if registry is not None else DEFAULT
        self._lock_engine: Engine | None = None
        self._claim_mode: str | None = None
        # While a tick holds its lock, commands it runs take their locks on the same connection. Per
        # thread: a threaded web server may run two web ticks on one runtime.
        self._local = threading.local()
        # Wraps every handler, job and task call: a host Flask app's app context (cronbox.web.hosting),
        # given the call's context. None: handlers run bare (the standalone app).
        self.handler_scope: Callable[[Any], ContextManager] | None = None
        # The host app's engines (cronbox.web.hosting), which a handler may have used: a forked child
        # drops their pooled connections too (drop_inherited_connections). None: no host app.
        self.host_engines: Callable[[], Iterable[Engine]] | None = None
        # Where sealed payloads are opened with (outbox.core.sealing): given by the layer owning the key
        # vault (the app's storage: cronbox.web.state, cronbox.cron.commands.base). None: the current one.
        self.sealer_source: Callable[[], Any] | None = None

    def sealer(self):
        """The sealer this runtime opens payloads with (None: no key vault here)."""
        from cronbox.outbox.core import sealing

        return self.sealer_source() if self.sealer_source is not None else sealing.current()

    def scope_for(self, ctx) -> Callable[[], ContextManager] | None:
        """What call_handler wraps the call of a handler receiving `ctx` in, if anything."""
        scope = self.handler_scope
        return None if scope is None else (lambda: scope(ctx))

    @property
    def consumers(self):
        return self.registry.consumers

    @property
    def jobs(self):
        return self.registry.jobs

    @property
    def is_mysql(self) -> bool:
        return is_mysql(self.engine)

    @property
    def is_postgresql(self) -> bool:
        return is_postgresql(self.engine)

    @property
    def is_server(self) -> bool:
        """MySQL/MariaDB or PostgreSQL: a lock connection of its own, SKIP LOCKED or token claims."""
        return is_server(self.engine)

    def claim_mode(self) -> str:
        """The claim path for this server: asked once, then cached."""
        if self._claim_mode is None:
            if not self.is_server:
                self._claim_mode = claiming.SQLITE
            else:
                wanted = self.settings.claim_mode
                version = server_version(self.engine)
                if self.is_postgresql and int(version.split("-")[0].split(".")[0]) < MIN_POSTGRESQL:
                    raise SettingsError(f"PostgreSQL {version.split('-')[0]} is too old: cronbox needs "
                                        f"{MIN_POSTGRESQL} or newer")
                available = supports_skip_locked(version)
                if wanted == "skip-locked" and not available:
                    raise SettingsError("CRONBOX_CLAIM_MODE=skip-locked, but this server has no SKIP LOCKED "
                                        "(needs MySQL 8.0.1+ or MariaDB 10.6+); use auto or token")
                if wanted == "token" or not available:
                    self._claim_mode = claiming.TOKEN
                else:
                    self._claim_mode = claiming.SKIP_LOCKED
        return self._claim_mode

    def default_queues(self) -> list[str]:
        """Queues a worker drains without --queue: CRONBOX_QUEUES (priority order), then any other
        queue of a registered job in registration order; never a queue forwarded to the broker
        (outbox.queue.forward_jobs: `amqp work` runs its jobs)."""
        configured = list(self.settings.queues)
        forwarded = set(self.registry.broker_queues.names())
        return [q for q in configured + [q for q in self.jobs.queues() if q not in configured] if q not in forwarded]

    def listed_queues(self) -> list[str]:
        """The queues the operator views list even when empty (queue status, the console, /metrics):
        the worker's (default_queues), then those forwarded to the broker, whose jobs' rows are the same."""
        return list(dict.fromkeys(self.default_queues() + self.registry.broker_queues.names()))

    @property
    def host_lock(self) -> RunLock | None:
        """The lock of the run (a tick) inside which this thread now executes commands, if any."""
        return getattr(self._local, "host_lock", None)

    @host_lock.setter
    def host_lock(self, lock: RunLock | None) -> None:
        self._local.host_lock = lock

    @property
    def lock_engine(self) -> Engine:
        """Connections held for a whole run (a lock's, a listener's): no pool on a server."""
        if self._lock_engine is None:
            self._lock_engine = make_engine(self.settings, role="lock") if self.is_server else self.engine
        return self._lock_engine

    def lock(self, purpose: str, *, hold_seconds: int = 3600) -> RunLock:
        self.lock_engine  # noqa: B018  (made on first use)
        host = self.host_lock
        # Read the connection now: after a re-take the host lock holds a new one.
        return run_lock(self.settings, self._lock_engine, purpose, hold_seconds=hold_seconds,
                        borrowed=host.connection if host is not None else None)

    def ensure_schema(self) -> None:
        ensure_schema(self.settings, self.engine, lambda purpose: self.lock(purpose))

    def drop_inherited_connections(self) -> None:
        """In a forked child (the worker pool's): forget every pooled connection the parent had, in
        the engines this runtime made and the host app's, without closing them, so nothing is sent
        on the parent's sockets and the parent's connections stay usable; this process opens its
        own on first use. SQLAlchemy's fork recipe, `engine.dispose(close=False)`. A run lock's
        connection is checked out, not pooled: its owner lets go of it (RunLock.abandon)."""
        engines = [self.engine]
        if self._lock_engine is not None and self._lock_engine is not self.engine:
            engines.append(self._lock_engine)
        if self.host_engines is not None:
            engines += self.host_engines()
        for engine in engines:
            engine.dispose(close=False)

    def dispose(self) -> None:
        self.engine.dispose()
        if self._lock_engine is not None and self._lock_engine is not self.engine:
            self._lock_engine.dispose()


def load_handlers(settings: Settings) -> list[str]:
    """Import the modules named in CRONBOX_HANDLERS (they register consumers, jobs, tasks)."""
    root = str(settings.app_root)
    if root not in sys.path:
        sys.path.insert(0, root)
    for module in settings.handlers:
        try:
            importlib.import_module(module)
        except Exception as exc:  # whatever the module raised on import: report it in one line
            raise HandlerImportError(
                f"CRONBOX_HANDLERS: could not import {module!r}: {type(exc).__name__}: {exc}"
            ) from exc
    return list(settings.handlers)


def open_runtime(*, role: str = "cron", settings: Settings | None = None, migrate: bool = True,
                 handlers: bool = True) -> Runtime:
    """`handlers=False`: the caller imports CRONBOX_HANDLERS later (a host app, after its factory returns)."""
    settings = settings or load_settings()
    configure_logging(settings.private_dir("logs"), stderr=settings.log_stderr)
    if handlers:
        load_handlers(settings)
    runtime = Runtime(settings, role=role)
    if migrate:
        runtime.ensure_schema()
    return runtime
