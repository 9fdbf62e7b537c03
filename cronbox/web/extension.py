"""`Cronbox`: cronbox as a Flask extension inside the host's own app.

    cronbox = Cronbox()
    def create_app():
        app = Flask(__name__)
        app.config.from_prefixed_env()   # or app.config["CRONBOX_..."] = ...
        db.init_app(app)
        cronbox.init_app(app, db=db)
        return app

Settings come from `app.config["CRONBOX_*"]` first, then the environment, then the app root's
`.env` (as everywhere in cronbox, the environment wins over `.env`). The database is the host's (`db`'s engine URL) unless CRONBOX_DATABASE_URL says
otherwise, so `cronbox.record(db.session, ...)` and the cron tick always meet in one database.
The instance folder is `<app.instance_path>/cronbox` unless CRONBOX_INSTANCE is set: cronbox
writes only there. `cronbox.storage` is the current app's sealed storage (keys in that folder), as
`db.session` is its session; the module-level `storage.*` calls use the same one in its context.

cronbox keeps an engine of its own (a small pool on the web side, one connection in a cron
process) rather than borrowing the host's: its connections are set to READ COMMITTED and UTC
(and SQLite's BEGIN IMMEDIATE), which the host's own queries must not inherit, and its claims
and locks must not wait behind the host's pool. A host's `db.session` still writes cronbox's
event rows in the host's transaction (`cronbox.record`); in cron processes the host's session
is bound to the handler's connection instead (cronbox.web.hosting).

Each part is a blueprint, switched off with CRONBOX_<PART>=off and moved with
CRONBOX_<PART>_PREFIX (files, health, metrics, webcron, ops). Nothing outside these blueprints is
touched: no app-wide error handler, session interface, secret key or CSRF setting.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from dotenv import dotenv_values
from flask import Flask, Request, current_app, has_app_context

from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.settings import ROOT_MARKERS, Settings, load_settings, url_prefix
from cronbox.outbox.core.settings_table import PARTS  # each part: a CRONBOX_<PART> switch and _PREFIX
from cronbox import storage as sealed_storage
from cronbox.storage import payload_keys

from . import hostcsrf
from .state import CronboxState

if TYPE_CHECKING:
    from cronbox.storage.service import Storage  # loaded on first use (libsodium), as cronbox.web.state does

HOOKS = ("console_operator", "console_login_url", "console_logout_url", "upload_operator")  # cronbox.web.hostauth


class Cronbox:
    """cronbox as a Flask extension: create it unbound, then `cronbox.init_app(app, db=db)` in your factory,
    after `db.init_app(app)`. It registers its blueprints (sealed files, health, metrics, web cron, the
    console; each switched off or moved by a setting), the `flask cron ...` commands, and keeps its state
    in `app.extensions["cronbox"]`; nothing else of your app is changed.

    `Cronbox(app, db=db)` sets it up at once; `db` and `settings` given here are `init_app`'s defaults
    for every app this object is set up on. The keyword arguments `console_operator`,
    `console_login_url`, `console_logout_url` and `upload_operator` are `init_app`'s, given here for
    every app this object is set up on; any other keyword is a `TypeError`.
    """

    def __init__(self, app: Flask | None = None, *, db: Any = None, settings: Settings | None = None, **hooks: Any):
        """`hooks`: init_app's console_operator, console_login_url, console_logout_url, upload_operator,
        for every app this object is set up on."""
        unknown = set(hooks) - set(HOOKS)
        if unknown:
            raise TypeError(f"Cronbox() got unexpected arguments: {', '.join(sorted(unknown))}")
        self.db = db
        self._settings = settings
        self._hooks = hooks
        if app is not None:
            self.init_app(app, db=db, settings=settings)

    def init_app(self, app: Flask, *, db: Any = None, settings: Settings | None = None,
                 console_operator: Callable[[Request], str | None | bool] | None = None,
                 console_login_url: str | Callable[[str], str] | None = None,
                 console_logout_url: str | None = None,
                 upload_operator: Callable[[Request], str | None | bool] | None = None) -> CronboxState:
        """Set cronbox up on `app`. `db`: the host's Flask-SQLAlchemy (initialised on `app` first), whose
        database cronbox uses (unless `CRONBOX_DATABASE_URL` names another); `settings`: ready-made
        Settings (the standalone app) instead of reading the configuration (`app.config`'s `CRONBOX_*`,
        then the environment, then the app root's `.env`). Imports the `CRONBOX_HANDLERS` modules.
        Returns the app's cronbox state.

        Raises `RuntimeError` when cronbox is already set up on `app`; `TypeError` for a hook that is not
        callable, or login/logout URLs without `console_operator`;
        `cronbox.outbox.core.errors.SettingsError` (a `CronboxError`) for a setting it cannot use, with
        one line naming it.

        The host's login instead of cronbox's own (cronbox.web.hostauth; the docs' console guide, "Use
        your app's login for the console"): `console_operator(request)` returns who is using the console (a string for the
        activity log), None (nobody signed in) or False (signed in, may not: always the 403 page), asked
        on every console request; then cronbox's password, login, setup and logout pages are gone. A
        browser refused with None gets a 403 page, or is sent to `console_login_url` (a URL, `next` added; or a function of the console path returning the
        URL). `console_logout_url`: the host's logout page, linked from the console. `upload_operator`
        (the same function or another) lets the host's logged-in users POST /files, with the token
        of `cronbox.upload_csrf_token()`, besides the upload bearer token."""
        if "cronbox" in app.extensions:
            raise RuntimeError("cronbox is already set up on this app (init_app called twice)")
        hooks = self._hooks  # Cronbox(...)'s, for what this call leaves unsaid
        console_operator = console_operator if console_operator is not None else hooks.get("console_operator")
        console_login_url = console_login_url if console_login_url is not None else hooks.get("console_login_url")
        console_logout_url = console_logout_url if console_logout_url is not None else hooks.get("console_logout_url")
        upload_operator = upload_operator if upload_operator is not None else hooks.get("upload_operator")
        for name, hook in (("console_operator", console_operator), ("upload_operator", upload_operator)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be a function of the request")
        if console_operator is None and (console_login_url or console_logout_url):
            raise TypeError("console_login_url and console_logout_url need console_operator")
        db = db if db is not None else self.db
        settings = settings or self._settings or settings_for(app, db)
        state = CronboxState(app=app, settings=settings, db=db, parts=_parts(settings),
                             console_operator=console_operator, console_login_url=console_login_url,
                             console_logout_url=console_logout_url, upload_operator=upload_operator,
                             extension=self)
        app.extensions["cronbox"] = state
        sealed_storage.mark_hosted()  # module-level storage.* outside an app context now refuses (whose keys?)
        hostcsrf.watch_requests(app)  # the host's sealed_upload_route views, before its CSRFProtect reads them
        _register_parts(app, state)  # the files part refuses an unsafe key folder first
        payload_keys.check_vault(settings, warn=True)  # else said once; CRONBOX_SEAL_PAYLOADS=all refuses it
        from cronbox.cron.cli import cli as cron_cli  # `flask --app clinic cron tick`

        if "cron" not in app.cli.commands:
            app.cli.add_command(cron_cli, "cron")
        return state

    @property
    def storage(self) -> Storage:
        """The current app's sealed storage (as `db.session` is the current app's session): `put`,
        `grant`, `revoke`, `signed_url`, `open_file`, under the keys of that app's instance folder.
        RuntimeError outside an app context or on an app this extension is not set up on."""
        state = current_app.extensions.get("cronbox") if has_app_context() else None
        if state is None or state.extension is not self:
            raise RuntimeError("cronbox.storage needs an app context of an app this Cronbox is set up on "
                               "(a request, or `with app.app_context():`)")
        return state.storage


def settings_for(app: Flask, db: Any = None) -> Settings:
    """Settings for a host app: its config's CRONBOX_* over .env and the environment."""
    overrides = {name: _text(value) for name, value in app.config.items()
                 if name.startswith("CRONBOX_") and value is not None}
    root = app_root(app, overrides)
    database = overrides.get("CRONBOX_DATABASE_URL") or _outside_config("CRONBOX_DATABASE_URL", root)
    if not database and db is not None:
        database = host_database_url(app, db)
    if database:
        overrides["DATABASE_URL"] = database
    return load_settings(root, overrides=overrides, instance=Path(app.instance_path) / "cronbox")


def _outside_config(name: str, root: Path) -> str:
    """A setting from the environment, else the app root's .env (as load_settings ranks them)."""
    if name in os.environ:
        return os.environ[name].strip()
    env_file = root / ".env"
    return ((dotenv_values(env_file).get(name) if env_file.is_file() else None) or "").strip()


def host_database_url(app: Flask, db: Any) -> str:
    """The URL of the host's default engine (Flask-SQLAlchemy resolves relative SQLite paths)."""
    try:
        with app.app_context():
            engine = db.engine
    except (KeyError, RuntimeError) as exc:
        raise RuntimeError("call db.init_app(app) before cronbox.init_app(app, db=db)") from exc
    return engine.url.render_as_string(hide_password=False)


def app_root(app: Flask, overrides: Mapping[str, str]) -> Path:
    """CRONBOX_APP_ROOT, else the nearest folder at or above the app's package holding
    artisan_via_cron.sh or .env, else the folder above the app's instance folder (Flask's
    default instance folder sits in the app root)."""
    configured = overrides.get("CRONBOX_APP_ROOT") or (os.environ.get("CRONBOX_APP_ROOT") or "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    here = Path(app.root_path).resolve()
    for folder in (here, *list(here.parents)[:3]):
        if any((folder / marker).is_file() for marker in ROOT_MARKERS):
            return folder
    return Path(app.instance_path).resolve().parent


def _text(value: Any) -> str:
    if value is True:
        return "on"
    if value is False:
        return "off"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _parts(settings: Settings) -> dict[str, str]:
    """The parts switched on, each with its URL prefix."""
    parts = {}
    for part in PARTS:
        name = f"CRONBOX_{part.upper()}"
        switch = (settings.get(name) or "on").lower()
        if switch not in ("on", "off"):
            raise SettingsError(f"{name}={switch!r} must be on or off")
        if switch == "on":
            parts[part] = settings.files_prefix if part == "files" else url_prefix(
                settings.get(f"{name}_PREFIX"), f"{name}_PREFIX")
    return parts


def _register_parts(app: Flask, state: CronboxState) -> None:
    from cronbox.cron.format import age

    from cronbox.cron.scheduling.metrics import window_seconds

    from . import files, health, metrics, ops, webcron  # here: they import cronbox.web.state, which is ready now

    parts = state.parts
    if "health" in parts:
        app.register_blueprint(health.bp, url_prefix=parts["health"] or None)
    if "metrics" in parts:
        window_seconds(state.settings)  # a bad CRONBOX_METRICS_WINDOW is init_app's one-line error, not a 500 later
        app.register_blueprint(metrics.bp, url_prefix=parts["metrics"] or None)
    if "webcron" in parts:
        app.register_blueprint(webcron.bp, url_prefix=parts["webcron"] or None)
    if "files" in parts:
        files.register(app, url_prefix=parts["files"])
    if "ops" in parts:
        ops.register(app, url_prefix=parts["ops"] + "/ops")
    app.add_template_filter(age, "cronbox_ago")  # the console's templates; a name no host filter has
