"""The Flask application: create_app() and the module-level `application` Passenger serves.

The runtime is built without touching the database, so `flask --app app cron
migrate` works against an empty MySQL schema; a fresh SQLite database is
migrated on the first request that needs it.
"""
from __future__ import annotations

from flask import Flask

from cron.cli import cli as cron_cli
from outbox.core.settings import Settings, load_settings
from outbox.engine.runtime import open_runtime
from web import register_blueprints


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or load_settings()
    app = Flask(__name__, instance_path=str(settings.instance), instance_relative_config=True)
    runtime = open_runtime(role="web", settings=settings, migrate=False)
    app.extensions["cronbox"] = runtime
    register_blueprints(app)
    app.cli.add_command(cron_cli, "cron")
    return app


application = create_app()
