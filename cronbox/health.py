"""GET /health: `{"status": "ok|warn|fail"}` for anyone (503 on fail); the full report with
`Authorization: Bearer <CRONBOX_HEALTH_TOKEN>`."""
from __future__ import annotations

from flask import Blueprint, jsonify

from cron.scheduling.health import FAIL, run_checks
from cronbox.auth import bearer_matches
from cronbox.state import state

bp = Blueprint("health", __name__)


@bp.get("/health")
def health():
    rt = state().runtime  # not cronbox.state.runtime(): health must answer with the database down
    report = run_checks(rt)
    body = report.as_json() if bearer_matches(rt.settings.health_token) else {"status": report.status}
    response = jsonify(body)
    response.status_code = 503 if report.status == FAIL else 200
    response.headers["Cache-Control"] = "no-store"
    return response
