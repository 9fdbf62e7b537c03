"""Which app a cron command runs for: the host's Flask app (CRONBOX_APP, or `flask --app ... cron`),
or cronbox's own settings (the standalone app).

`CRONBOX_APP=clinic:create_app` names a factory (or `clinic:app`, an app object; or just
`clinic`, where `create_app`, `make_app`, `app` or `application` is looked for, as Flask does).
It is read from the environment, then the app root's .env; the app root goes first on sys.path,
so the host's package imports under cron's bare environment. The app is built once per command
and must have called `Cronbox().init_app(app)`; its settings are the ones the command uses.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from dotenv import dotenv_values

from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.settings import find_app_root
from cronbox.outbox.core.text import describe
from cronbox.outbox.engine.runtime import Runtime, open_runtime

FACTORY_NAMES = ("create_app", "make_app")
APP_NAMES = ("app", "application")


def app_spec(environ=None) -> tuple[str | None, Path | None]:
    """(CRONBOX_APP, the app root it is imported from), from the environment or the root's .env."""
    environ = os.environ if environ is None else environ
    root = find_app_root(environ)
    if "CRONBOX_APP" in environ:  # set, even blank, it wins over .env (as in outbox.core.settings)
        spec = environ["CRONBOX_APP"]
    elif root is not None and (root / ".env").is_file():
        spec = dotenv_values(root / ".env").get("CRONBOX_APP")
    else:
        spec = None
    return (spec or "").strip() or None, root


def load_app(spec: str, root: Path | None):
    """Import and build the app CRONBOX_APP names; SettingsError (one line) for anything wrong."""
    module_name, _, attribute = spec.partition(":")
    where = str(root or Path.cwd())
    if where not in sys.path:
        sys.path.insert(0, where)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise SettingsError(f"CRONBOX_APP={spec}: could not import {module_name!r}: {describe(exc)}") from exc
    names = [attribute] if attribute else [*FACTORY_NAMES, *APP_NAMES]
    for name in names:
        target = getattr(module, name.removesuffix("()"), None)
        if target is None:
            continue
        try:
            app = target() if callable(target) and not _is_app(target) else target
        except Exception as exc:
            raise SettingsError(f"CRONBOX_APP={spec}: {name}() failed: {describe(exc)}") from exc
        if not _is_app(app):
            raise SettingsError(f"CRONBOX_APP={spec}: {name} is not a Flask app or a factory returning one")
        return app
    raise SettingsError(f"CRONBOX_APP={spec}: {module_name!r} has no {' / '.join(names)}")


def _is_app(value) -> bool:
    from flask import Flask

    return isinstance(value, Flask)


def cronbox_state(app, spec: str):
    state = app.extensions.get("cronbox")
    if state is None:
        raise SettingsError(f"CRONBOX_APP={spec}: the app does not set up cronbox (call Cronbox().init_app(app) "
                            "in its factory)")
    return state


class HostApp:
    """The host app of one cron command, with the app context pushed for the command's duration."""

    def __init__(self, app, spec: str):
        self.app = app
        self.state = cronbox_state(app, spec)
        self._context = app.app_context()
        self._context.push()

    def open_runtime(self, *, migrate: bool) -> Runtime:
        runtime = open_runtime(role="cron", settings=self.state.settings, migrate=False, handlers=False)
        self.state.attach_cron(runtime)
        if migrate:
            runtime.ensure_schema()
        return runtime

    def close(self) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.pop()


def current_host_app() -> HostApp | None:
    """The app a cron command runs for: the current Flask app (`flask --app clinic cron ...`) or
    CRONBOX_APP's; None for the standalone settings."""
    # Only a process that already imported Flask can be inside an app context: the standalone cron
    # line never imports it (about 100 ms of a tick's start-up).
    flask = sys.modules.get("flask")
    if flask is not None and flask.has_app_context() and "cronbox" in flask.current_app.extensions:
        return HostApp(flask.current_app._get_current_object(), "(flask --app)")
    spec, root = app_spec()
    if spec is None:
        return None
    return HostApp(load_app(spec, root), spec)
