"""GET /health: `{"status": "ok|warn|fail"}` for anyone (503 on fail); the full report with
`Authorization: Bearer <CRONBOX_HEALTH_TOKEN>`.

The anonymous answer must stay cheap, as anyone may ask it as often as they like: each call pings
the database and reads the tick's and consumers' heartbeats (a few indexed statements, whatever
the backlog), and takes the backlog counts' grade from the last BACKLOG_SECONDS, kept per process
on the extension's state; only the token holder's full report counts the backlog on every call.
So a database down or a stale tick shows at once, a growing backlog within BACKLOG_SECONDS.
"""
from __future__ import annotations

from flask import Blueprint, jsonify

from cronbox.cron.scheduling.health import FAIL, ORDER, backlog_status, run_checks
from cronbox.web.auth import bearer_matches
from cronbox.web.state import state
from cronbox.outbox.core import clock

bp = Blueprint("health", __name__)
BACKLOG_SECONDS = 30


@bp.get("/health")
def health():
    st = state()
    rt = st.runtime  # not cronbox.web.state.runtime(): health must answer with the database down
    if bearer_matches(rt.settings.health_token):
        report = run_checks(rt)
        body, status = report.as_json(), report.status
    else:
        report = run_checks(rt, backlog=False)
        status = report.status if report.status == FAIL else max(report.status, _backlog(st, rt), key=ORDER.get)
        body = {"status": status}
    response = jsonify(body)
    response.status_code = 503 if status == FAIL else 200
    response.headers["Cache-Control"] = "no-store"
    return response


def _backlog(st, rt) -> str:
    """The backlog counts' grade, counted again once it is BACKLOG_SECONDS old (a failed count is
    not kept: the database's trouble is reported as it happens)."""
    now = clock.utcnow()
    kept = st.health_backlog
    if kept is None or not 0 <= (now - kept[0]).total_seconds() < BACKLOG_SECONDS:
        try:
            kept = st.health_backlog = (now, backlog_status(rt))
        except Exception:  # noqa: BLE001 - health answers with the database down
            return FAIL
    return kept[1]
