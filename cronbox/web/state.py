"""What cronbox keeps for one Flask app, in `app.extensions["cronbox"]`.

The runtime (engine, sessions, handlers) and the sealed storage are built on first use, not by
`init_app`: a cron process hands in its own one-connection runtime before anything asks
(cronbox.web.hosting), and a web process opens its small pool only when a request needs it. Handler
modules (CRONBOX_HANDLERS) are imported on that first use too, after the host's factory returned,
so they may import the host's models and `db` without an import cycle. The app's runtime then runs
only what those modules own (outbox.engine.registry.HandlerModules): two apps in one process, each
with its own CRONBOX_HANDLERS, never run each other's consumers, jobs or tasks.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, current_app

from cronbox.outbox.core.settings import Settings
from cronbox.outbox.engine.registry import DEFAULT, HandlerModules, module_of
from cronbox.outbox.engine.runtime import Runtime, load_handlers, open_runtime

log = logging.getLogger("cronbox")


@dataclass
class CronboxState:
    app: Flask
    settings: Settings
    db: Any = None  # the host's Flask-SQLAlchemy object, when init_app was given one
    parts: dict[str, str] = field(default_factory=dict)  # part -> URL prefix, for the parts switched on
    # The host's login in front of cronbox (cronbox.web.hostauth): None keeps cronbox's own password and token.
    console_operator: Any = None  # request -> operator identity or None
    console_login_url: Any = None  # where the console sends a refused browser: a URL, or next_path -> URL
    console_logout_url: str | None = None  # the console's "Log out" link: the host's logout page
    upload_operator: Any = None  # request -> uploader identity or None, for POST /files from a browser
    health_backlog: tuple | None = None  # (when, grade) of the backlog counts anonymous /health reuses
    extension: Any = None  # the Cronbox object whose init_app made this state (Cronbox.storage checks it)
    _runtime: Runtime | None = None
    _storage: Any = None
    _sealer: Any = None
    _schema_checked: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def runtime(self) -> Runtime:
        """The process's runtime for this app (a web pool unless a cron process handed in its own)."""
        if self._runtime is None:
            with self._lock:
                if self._runtime is None:
                    from .hosting import HostScope, host_engines

                    runtime = open_runtime(role="web", settings=self.settings, migrate=False, handlers=False)
                    runtime.handler_scope = HostScope(self.app, self.db)  # a web tick's handlers, as in cron
                    runtime.host_engines = lambda: host_engines(self.app, self.db)
                    runtime.sealer_source = self.sealer  # sealed payloads open under this app's keys
                    try:
                        self._load_handlers(runtime)
                    except BaseException:
                        runtime.dispose()
                        raise
                    self._runtime = runtime
        return self._runtime

    def use_runtime(self, runtime: Runtime) -> None:
        """Run on `runtime` (a cron command's) instead of opening a web pool; storage follows it. The
        command checks its own schema before it runs anything: checking again from inside a handler (a
        job's `storage.put()`) would open a second SQLite writer behind the handler's own transaction
        and wait for it until the handler's timeout."""
        with self._lock:
            self._runtime, self._storage = runtime, None
            self._schema_checked = True

    @property
    def storage(self):
        """This app's sealed storage, on its runtime and the settings init_app resolved (its instance
        folder's keys): what `cronbox.storage` and, in this app's context, the module-level `storage.*` use.
        Built on the checked runtime (`checked_runtime`): a host's first request may be a `seal_upload`,
        which must not seal a file its row cannot follow (a fresh SQLite database migrated first, an
        unmigrated server database refused before a byte is sealed)."""
        if self._storage is None:
            from cronbox.storage.service import Storage  # here: libsodium and cryptography load only when files are used

            runtime = self.checked_runtime()
            with self._lock:
                if self._storage is None:
                    self._storage = Storage(self.settings, runtime.sessions)
        return self._storage

    def sealer(self):
        """This app's payload sealer (outbox.core.sealing), under its instance folder's keys. From the
        settings alone, never through `storage`: record() and dispatch() ask for it inside the caller's
        transaction, where the storage's schema check (a connection of its own) would wait on it."""
        if self._sealer is None:
            from cronbox.storage.payload_keys import sealer_of

            with self._lock:
                if self._sealer is None:
                    self._sealer = sealer_of(self.settings)
        return self._sealer

    def derived_keys(self, label: bytes) -> list[bytes]:
        """Keys for `label` (the console's cookie and CSRF tokens, upload CSRF tokens), one per URL-signing
        key, oldest first (the last one signs). Read per call (one scandir: storage.keyring), so a new
        key is used without a restart and older ones still verify."""
        return [hmac.new(key, label, hashlib.sha256).digest() for key in self.storage.keyring().signing_keys]

    def attach_cron(self, runtime: Runtime) -> None:
        """A cron command's runtime (cron.hostapp): handlers run in this app's context on its
        connection, and the handler modules are imported now, after the factory returned."""
        from .hosting import HostScope, close_host_pools, host_engines

        runtime.handler_scope = HostScope(self.app, self.db)
        runtime.host_engines = lambda: host_engines(self.app, self.db)  # a pool's children drop their pools too
        runtime.sealer_source = self.sealer  # sealed payloads open under this app's keys, context or not
        self.use_runtime(runtime)
        modules = self._load_handlers(runtime)
        close_host_pools(self.app, self.db)  # last: what the factory or a handler module's import opened
        if modules is None:
            return
        for kind, item in DEFAULT.declarations():  # a cron process builds one app: what it leaves out is a mistake
            if not modules.own(item):
                log.warning("not run by this app: %s %s is declared in %s, which CRONBOX_HANDLERS (%s) neither "
                            "names nor imports", kind, item.name, module_of(item) or "?",
                            ",".join(modules.names) or "empty")

    def _load_handlers(self, runtime: Runtime) -> HandlerModules | None:
        """Import CRONBOX_HANDLERS and give `runtime` what they own rather than the whole process's
        DEFAULT; a runtime that came with a registry of its own (Runtime(registry=...)) keeps it."""
        load_handlers(self.settings)
        if runtime.registry is not DEFAULT:
            return None
        modules = HandlerModules(self.settings.handlers)
        runtime.registry = DEFAULT.owned_by(modules)
        return modules

    def checked_runtime(self) -> Runtime:
        """The runtime, after migrating a fresh embedded SQLite database once (MySQL: `cron migrate`)."""
        runtime = self.runtime
        if not self._schema_checked:
            runtime.ensure_schema()
            self._schema_checked = True
        return runtime


def state(app: Flask | None = None) -> CronboxState:
    """cronbox's state for `app` (default: the current app); RuntimeError when init_app was not called."""
    app = app or current_app
    try:
        return app.extensions["cronbox"]
    except KeyError:
        raise RuntimeError("cronbox is not set up on this app: call Cronbox().init_app(app)") from None


def runtime() -> Runtime:
    """The current app's cronbox runtime; migrates a fresh SQLite database on first use."""
    return state().checked_runtime()
