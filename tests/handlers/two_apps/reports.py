"""A job module `back` owns by importing the module itself (`from . import reports`)."""
from __future__ import annotations

from cronbox import job

from .ran import note


@job("reports", name="two_apps.report")
def report(payload, ctx):
    note("two_apps.report", payload)
