"""The front desk app's handlers (CRONBOX_HANDLERS=tests.handlers.two_apps.front)."""
from __future__ import annotations

from cronbox import consumer, forward

from .ran import note
from .shared_jobs import remind  # noqa: F401  (owned by import: this app runs it)

to_broker = forward("two_apps.visit.*", exchange="front", name="front.to-broker")


@consumer("two_apps.visit.paid", name="front.receipt", runs="tick")  # its events are forwarded too
def receipt(event, ctx):
    note("front.receipt", event.payload)
