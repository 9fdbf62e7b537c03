"""The database side of tests.handlers.batch_broker's batch and chain: queue "mixdb", run by `queue work`."""
from __future__ import annotations

import cronbox
from tests.handlers.batch_broker import member_and_step, record

db_member, db_step = member_and_step("mixdb", "db")


@cronbox.job("mixdb", name="mix.finally", tries=5, timeout=10)
def finally_(payload, ctx):
    progress = ctx.batch.progress(ctx.session)
    record("early-finally" if progress.pending != 0 or progress.finished_at is None else "finally", payload, ctx)
