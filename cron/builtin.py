"""Tasks every installation runs from the tick: retention (daily) and the health check (every 5 minutes).

(`storage sweep` joins them once sealed storage is installed.)
"""
from __future__ import annotations

import logging

import outbox.channels  # noqa: F401  (the alert jobs must be registered in every tick)
from cron import schedule
from cron.health import alert_on, run_checks
from cron.retention import prune_all

log = logging.getLogger("cronbox")


@schedule.cron("17 3 * * *", name="cronbox.prune")
def prune(ctx):
    counts = prune_all(ctx.runtime)
    log.info("prune: %s", ", ".join(f"{n} {what}" for what, n in counts.items()))


@schedule.every(minutes=5, name="cronbox.health")
def health(ctx):
    report = run_checks(ctx.runtime)
    sent = alert_on(ctx.runtime, report)
    log.info("health: %s%s", report.status, f" (alerts: {', '.join(sent)})" if sent else "")
