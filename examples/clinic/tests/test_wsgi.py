"""What Passenger serves: passenger_wsgi.py's `application` is the clinic with cronbox's parts mounted,
and the clinic's app.config decides about them over the environment."""
from __future__ import annotations

import runpy

from conftest import EXAMPLE_ROOT, STAFF


def test_passenger_serves_the_clinic_with_cronbox_parts(make_app):
    application = make_app(app=runpy.run_path(str(EXAMPLE_ROOT / "passenger_wsgi.py"))["application"])
    client = application.test_client()
    health = client.get("/health")
    assert health.status_code in (200, 503) and health.get_json()["status"] in ("ok", "warn", "fail")
    assert client.get("/ops/", follow_redirects=False).status_code != 404
    assert client.post("/appointments/1/pay", json={}).status_code == 401  # the clinic's own routes
    assert client.post("/appointments/1/pay", json={"amount": "1"}, headers=STAFF).status_code == 404


def test_app_config_switches_and_moves_parts_over_the_environment(make_app, monkeypatch):
    monkeypatch.setenv("CRONBOX_OPS", "on")
    app = make_app({"CRONBOX_OPS": "off", "CRONBOX_HEALTH_PREFIX": "/status"})
    client = app.test_client()
    assert client.get("/ops/").status_code == 404
    assert client.get("/health").status_code == 404
    assert client.get("/status/health").status_code in (200, 503)
