"""Grouped handlers for the subprocess tests (CRONBOX_HANDLERS=tests.handlers.grouped): group commit
under crashes. They write the same effect rows as tests.handlers.effects."""
from __future__ import annotations

import os
import time

from sqlalchemy import insert

import cronbox
from cronbox.outbox.core.faults import crash_point
from tests.handlers.effects import effects


def _pause():
    seconds = float(os.environ.get("TEST_SLEEP") or 0)
    if seconds:
        time.sleep(seconds)


@cronbox.consumer("gwork", name="grouped.db", timeout=0.5, max_attempts=100, grouped=True)
def grouped_writer(event, ctx):
    _pause()
    ctx.session.execute(insert(effects).values(consumer="grouped.db", event_id=event.id))
    crash_point("in-handler")


@cronbox.job("gjobs", name="grouped.job", timeout=0.5, tries=100, grouped=True)
def grouped_job(payload, ctx):
    _pause()
    ctx.session.execute(insert(effects).values(consumer="grouped.job", event_id=payload["n"]))
    crash_point("in-handler")
