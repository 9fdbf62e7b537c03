"""A job defined outside any CRONBOX_HANDLERS module: `front` owns it by importing the function."""
from __future__ import annotations

from cronbox import job

from .ran import note


@job("default", name="two_apps.remind")
def remind(payload, ctx):
    note("two_apps.remind", payload)
