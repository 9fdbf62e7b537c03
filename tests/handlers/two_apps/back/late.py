"""A submodule of `back` that `back` does not import: the package prefix makes it back's."""
from __future__ import annotations

from cronbox import consumer

from ..ran import note


@consumer("two_apps.visit.refunded", name="back.refund", runs="tick")
def refund(event, ctx):
    note("back.refund", event.payload)
