"""The front desk app's handlers (CRONBOX_HANDLERS=tests.handlers.two_apps.front)."""
from __future__ import annotations

from cronbox import consumer, forward

from .ran import note
from .shared_jobs import remind  # noqa: F401  (owned by import: this app runs it)

# back.ledger (runs unsaid) also takes visit.paid: refused in one registry, fine in two apps.
to_broker = forward("visit.*", exchange="front", name="front.to-broker")


@consumer("visit.paid", name="front.receipt", runs="tick")  # its events are forwarded too
def receipt(event, ctx):
    note("front.receipt", event.payload)
