"""Imported by the test process, named and imported by neither app: neither runs it."""
from __future__ import annotations

from cronbox import consumer

from .ran import note


@consumer("two_apps.visit.paid", name="stray.audit", runs="tick")
def audit(event, ctx):
    note("stray.audit", event.payload)
