"""cronbox's own Flask application, the quick try: `create_app()` and the `application` Passenger serves.

It is a thin user of the extension, wired as any host app is (cronbox.Cronbox). `application` is
built on first use (PEP 562), so `CRONBOX_APP=app:create_app` builds one app, not two. The runtime
is built without touching the database, so `flask --app app cron migrate` works against an empty
MySQL schema; a fresh SQLite database is migrated on the first request that needs it.
"""
from __future__ import annotations

from flask import Flask

from cronbox import Cronbox
from cronbox.outbox.core.settings import Settings, load_settings


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or load_settings()
    app = Flask(__name__, instance_path=str(settings.instance), instance_relative_config=True)
    Cronbox().init_app(app, settings=settings)
    return app


def __getattr__(name: str):
    if name == "application":
        global application
        application = create_app()
        return application
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
