"""A job module `back` owns by `import tests.handlers.two_apps.dotted` (which binds only `tests`)."""
from __future__ import annotations

from cronbox import job

from .ran import note


@job("reports", name="two_apps.dotted")
def dotted(payload, ctx):
    note("two_apps.dotted", payload)
