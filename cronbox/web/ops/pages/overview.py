"""Overview: health checks, backlogs, queue depths, recent ticks and the 24-hour chart."""
from __future__ import annotations

from flask import render_template

from cronbox.cron.scheduling.health import run_checks
from cronbox.outbox.core import clock
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine import heartbeat
from cronbox.outbox.events import deliveries
from cronbox.outbox.queue import jobstore
from cronbox.web.state import runtime

from .. import bp, chart

RECENT_TICKS = 15


@bp.get("/")
def overview():
    rt = runtime()
    now = clock.utcnow()
    report = run_checks(rt)

    def read(s):
        ticks = heartbeat.recent(s, "tick", RECENT_TICKS)
        return deliveries.backlog(s, now), deliveries.unfanned_count(s), ticks, chart.series(s, now)

    backlog, unfanned, ticks, data = in_transaction(rt.sessions, read)
    queues = report.queues  # read by the health checks a moment ago: counting failed jobs once is enough
    names = list(dict.fromkeys(rt.listed_queues() + sorted(queues)))
    queue_rows = [queues.get(n) or jobstore.QueueStatus(n) for n in names]
    return render_template("cronbox_ops/overview.html", report=report, backlog=backlog, unfanned=unfanned,
                           queues=queue_rows, ticks=ticks, drawing=chart.draw(data, rt.settings.cron_interval), now=now)
