"""A small clinic: patients, appointments, payments, with cronbox for what happens after a payment.

    from clinic import create_app
    app = create_app()

Its settings come from the app root's `.env` and the environment (which wins), then `config`;
cronbox reads its own CRONBOX_* settings from app.config, the environment and the same `.env`.
The cron line builds the app with `create_app()` too (CRONBOX_APP=clinic:create_app), so the
consumers in clinic.handlers run inside this app, on its models and its `db`.
"""
from __future__ import annotations

import os
from pathlib import Path

from dotenv import dotenv_values
from flask import Flask

from cronbox import Cronbox

from .models import db

ROOT = Path(__file__).resolve().parent.parent  # the app root: .env, passenger_wsgi.py, artisan_via_cron.sh

cronbox = Cronbox()


def create_app(config: dict | None = None) -> Flask:
    env = {**dotenv_values(ROOT / ".env"), **os.environ}
    app = Flask(__name__)
    app.config.from_mapping(
        SQLALCHEMY_DATABASE_URI=env.get("DATABASE_URL") or "sqlite:///clinic.db",  # relative: in instance/
        # Shared hosts close idle MySQL connections after 20-60 s (wait_timeout).
        SQLALCHEMY_ENGINE_OPTIONS={"pool_pre_ping": True, "pool_recycle": 15},
        CLINIC_NAME=env.get("CLINIC_NAME") or "Clinic",
        CLINIC_STAFF_TOKEN=env.get("CLINIC_STAFF_TOKEN"),
        CRONBOX_HANDLERS="clinic.handlers",  # imported by cronbox after this factory returned
    )
    app.config.update(config or {})

    db.init_app(app)
    cronbox.init_app(app, db=db)  # after db.init_app: cronbox uses the clinic's database

    from . import views

    app.register_blueprint(views.bp)

    return app
