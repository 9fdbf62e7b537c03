"""Tasks every installation runs from the tick: retention (daily), the health check (every 5 minutes)
and the sealed-storage sweep (hourly: orphaned files of uploads that never committed, ended grants,
audit rows past their retention).

Each task imports what it runs when it runs: most ticks run none of them, and retention alone
loads the tables of every family (the console's, the channels' attempts) a quiet tick never reads.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from cronbox.cron.scheduling import schedule
import cronbox.outbox.channels  # noqa: F401  (the alert jobs must be registered in every tick)

log = logging.getLogger("cronbox")
SWEEP_GRACE = timedelta(hours=24)  # a slow caller's transaction may still commit its file's row


@schedule.every(days=1, name="cronbox.prune")  # at 00:00 UTC
def prune(ctx):
    from cronbox.cron.scheduling.retention import prune_all

    counts = prune_all(ctx.runtime)
    log.info("prune: %s", ", ".join(f"{n} {what}" for what, n in counts.items()))


@schedule.every(hours=1, name="cronbox.storage_sweep")
def storage_sweep(ctx):
    if not ctx.settings.sealed_dir.exists():
        return  # nothing was ever sealed here: no orphans, grants or audit rows
    # Files and rows only: no keys, no ciphers (libsodium) and no token signer are loaded for it.
    from cronbox.storage.maintenance import Sweepable, sweep
    from cronbox.storage.vault import Vault

    settings = ctx.runtime.settings
    result = sweep(Sweepable(settings, ctx.runtime.sessions, Vault(settings)), grace=SWEEP_GRACE.total_seconds())
    log.info("storage sweep: %d orphaned and %d temporary files removed, %d grants and %d audit rows deleted",
             result.orphans, result.temporary, result.grants, result.audit)


@schedule.every(minutes=5, name="cronbox.health")
def health(ctx):
    from cronbox.cron.scheduling.health import alert_on, run_checks

    report = run_checks(ctx.runtime)
    sent = alert_on(ctx.runtime, report)
    log.info("health: %s%s", report.status, f" (alerts: {', '.join(sent)})" if sent else "")
