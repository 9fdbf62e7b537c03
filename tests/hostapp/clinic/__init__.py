"""The clinic: a Flask 3 + Flask-SQLAlchemy app with a factory, as a cronbox user writes it.

Configuration: the CLINIC_* lines of the app root's .env, then CLINIC_* variables (Flask's
from_prefixed_env), so that cron, which passes no variables, sees the same settings; the
prefix goes (CLINIC_SQLALCHEMY_DATABASE_URI, CLINIC_CRONBOX_HANDLERS). The .env is read, not
loaded into os.environ: cronbox reads its own CRONBOX_* lines there itself.
`factories_running` lets clinic.handlers check it is never imported while the factory runs.
"""
from __future__ import annotations

from pathlib import Path

from dotenv import dotenv_values
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase

from cronbox import Cronbox


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
cronbox = Cronbox()
factories_running = 0

ROOT = Path(__file__).resolve().parent.parent


def create_app(config: dict | None = None) -> Flask:
    global factories_running
    factories_running += 1
    try:
        app = Flask(__name__)
        app.config.from_mapping(SQLALCHEMY_DATABASE_URI="sqlite:///clinic.db")
        dotenv = dotenv_values(ROOT / ".env") if (ROOT / ".env").is_file() else {}
        app.config.from_mapping({name.removeprefix("CLINIC_"): value for name, value in dotenv.items()
                                 if name.startswith("CLINIC_")})
        app.config.from_prefixed_env("CLINIC")
        app.config.update(config or {})
        db.init_app(app)
        from clinic import models, routes  # noqa: F401  (the models register on db.metadata)

        app.register_blueprint(routes.bp)
        with app.app_context():
            db.create_all()  # as many small apps do: leaves a connection in the host's pool
        cronbox.init_app(app, db=db)
        return app
    finally:
        factories_running -= 1
