"""Factories that go wrong in the ways CRONBOX_APP must report in one line (tests/processes/test_host_cron.py)."""
from flask import Flask


def raising():
    raise RuntimeError("no configuration for this clinic\n(and a second line)")


def not_an_app():
    return {"app": "a dict, not a Flask app"}


def without_cronbox():
    return Flask(__name__)  # never calls Cronbox().init_app(app)
