"""The back office app's handlers (CRONBOX_HANDLERS=tests.handlers.two_apps.back): a package, so a
submodule imported by anyone (`late`) is its too."""
from __future__ import annotations

from cronbox import consumer, schedule

import tests.handlers.two_apps.dotted  # noqa: F401  (owned by import, though it binds only `tests`)

from .. import reports  # noqa: F401  (owned by import: this app runs its jobs)
from ..ran import note


@consumer("two_apps.visit.paid", name="back.ledger", runs="tick")
def ledger(event, ctx):
    note("back.ledger", event.payload)


@schedule.every(hours=1, name="back.reconcile")
def reconcile(ctx):
    note("back.reconcile", {})
