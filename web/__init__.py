"""Flask blueprints: downloads, health, web-cron, operator console (added by their issues)."""
from __future__ import annotations

from flask import Flask, current_app

from outbox.engine.runtime import Runtime


def runtime() -> Runtime:
    """The app's cronbox runtime; migrates a fresh SQLite database on first use."""
    rt: Runtime = current_app.extensions["cronbox"]
    if not current_app.extensions.get("cronbox.schema_checked"):
        rt.ensure_schema()
        current_app.extensions["cronbox.schema_checked"] = True
    return rt


def register_blueprints(app: Flask) -> None:
    """Each web feature registers its blueprint here."""
    from cron.format import age
    from web import files, health, ops, webcron  # here, not at the top: they import web.runtime

    app.register_blueprint(health.bp)
    app.register_blueprint(webcron.bp)
    files.register(app)
    ops.register(app)  # after files: the console derives its cookie key from the storage keys
    app.add_template_filter(age, "ago")
