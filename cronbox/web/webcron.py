"""POST /cron/tick: the tick over HTTP, for hosts whose cron is coarse or missing.

Call it from an external cron or uptime service with
`Authorization: Bearer <CRONBOX_CRON_TOKEN>` (never in the URL). It runs a short
tick inside the request (CRONBOX_WEB_TICK_MAX_TIME, 20 s; no lingering: a web
worker is too precious to sleep in), refuses to start more often than every
CRONBOX_WEB_TICK_INTERVAL seconds (30; shared through the database, so every web
process agrees), never overlaps a running tick (same lock as the cron line), and
answers with a JSON summary. With no token configured the endpoint does not exist.

A set-up the tick refuses to run with (a bad setting, a handler module that does not import, a
consumer whose place is unsaid next to a forward target) is the line the cron command prints, as
`{"status": "error", "error": "<line>"}` with a 500 and one log line: the fault is the server's and
lasts until someone fixes it (a 503 would read as "busy, retry"), and every monitor counts a 500
as down. It is answered here, not by an error handler, so the host's handlers never see it.
"""
from __future__ import annotations

import logging

from flask import Blueprint, abort, jsonify

from cronbox.cron.cli import main as run_command
from cronbox.cron.scheduling.tick import run_tick
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import CronboxError, SettingsError
from cronbox.outbox.core.text import clean_text
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.queue.ratelimit import at_most_every
from cronbox.web.state import runtime, state
from cronbox.web.auth import bearer_matches
from cronbox.web.hostcsrf import exempt_from_host_csrf

log = logging.getLogger("cronbox")
bp = Blueprint("webcron", __name__)
exempt_from_host_csrf(bp)  # a bearer token, never sent by a browser on its own


def _seconds(settings, name: str, default: float) -> float:
    """A number of seconds from the settings, at least 1, or the default when it is no number the
    settings' parser takes (an operator's typo in .env must not turn every call into a 500)."""
    try:
        return max(settings.number(name, default, float, minimum=0), 1.0)
    except SettingsError:
        return default


@bp.post("/cron/tick")
def tick():
    token = state().settings.cron_token  # the settings, not the runtime: a caller without the token learns nothing
    if not token:
        abort(404)
    if not bearer_matches(token):
        return _json({"error": "forbidden"}, 403)
    try:
        return _tick(runtime())
    except CronboxError as exc:  # a set-up the tick refuses (CronboxError: ours, its message says the fix)
        line = clean_text(str(exc))
        log.error("web tick refused: %s", line)
        return _json({"status": "error", "error": line}, 500)


def _tick(rt):
    interval = _seconds(rt.settings, "CRONBOX_WEB_TICK_INTERVAL", 30)
    wait = in_transaction(rt.sessions, lambda s: at_most_every(s, "web-tick", interval, clock.utcnow()))
    if wait is not None:
        response = _json({"error": "too soon", "retry_after": round(wait, 1)}, 429)
        response.headers["Retry-After"] = str(int(wait) + 1)
        return response
    report = run_tick(rt, run_command=run_command, max_time=_seconds(rt.settings, "CRONBOX_WEB_TICK_MAX_TIME", 20), linger=False,
                      memory_mb=_seconds(rt.settings, "CRONBOX_WEB_TICK_MEMORY", 256))
    if report.skipped:
        return _json({"skipped": True, "reason": "tick already running"}, 200)
    r, w = report.relay.stats, report.worker.stats
    return _json({
        "skipped": False, "stopped": report.result.stop_reason, "seconds": round(report.seconds, 3),
        "delivered": r.done, "retried": r.retried, "dead": r.gave_up,
        "jobs_done": w.done, "jobs_retried": w.retried, "jobs_failed": w.gave_up,
        "tasks": report.scheduler.ran, "one_off_runs": report.once.ran, "error": report.result.error,
    }, 200 if report.exit_code == 0 else 500)


def _json(body: dict, status: int):
    response = jsonify(body)
    response.status_code = status
    response.headers["Cache-Control"] = "no-store"
    return response
