"""GET /metrics: cronbox's numbers for Prometheus (text format 0.0.4), for a scraper holding
`Authorization: Bearer <CRONBOX_METRICS_TOKEN>` (or, unset, CRONBOX_HEALTH_TOKEN's).

No token configured: the endpoint does not exist (404). No Authorization header: 401 with
`WWW-Authenticate: Bearer`; a wrong token: 403; neither carries a number. The database not answering:
503 and one line, so the scrape fails visibly (`up` stays 1 but every cronbox_* series goes stale).
"""
from __future__ import annotations

import logging

from flask import Blueprint, Response, abort, request
from sqlalchemy.exc import DBAPIError

from cronbox.cron.scheduling import metrics
from cronbox.web.auth import bearer_matches
from cronbox.web.state import state

bp = Blueprint("metrics", __name__)
log = logging.getLogger("cronbox")


def _text(body: str, status: int, **headers: str) -> Response:
    response = Response(body, status=status, mimetype=None, content_type=metrics.CONTENT_TYPE)
    response.headers["Cache-Control"] = "no-store"
    response.headers.update(headers)
    return response


@bp.get("/metrics")
def scrape():
    st = state()
    token = metrics.metrics_token(st.settings)
    if not token:
        abort(404)
    if not bearer_matches(token):
        if not request.headers.get("Authorization"):
            return _text("unauthorized: send Authorization: Bearer <token>\n", 401, **{"WWW-Authenticate": "Bearer"})
        return _text("forbidden\n", 403)
    rt = st.runtime  # not checked_runtime(): a scrape never migrates
    try:
        families = metrics.collect(rt)
    except DBAPIError as exc:
        log.warning("metrics: database unavailable: %s", type(getattr(exc, "orig", exc)).__name__)
        return _text("database unavailable\n", 503)
    return _text(metrics.render(families), 200)
