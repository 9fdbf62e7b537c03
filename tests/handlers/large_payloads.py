"""A consumer and a job whose payloads are large (CRONBOX_HANDLERS=tests.handlers.large_payloads).

large.take (events of type large.made) and large.job (queue "large") each make one copy of the
payload's blob, as a handler that works on its payload does: their own RSS growth, one payload.
"""
from __future__ import annotations

import cronbox


@cronbox.consumer("large.made", name="large.take")
def take(event, ctx):
    assert len(event.payload["blob"].encode()) == event.payload["size"]


@cronbox.job("large", name="large.job")
def large_job(payload, ctx):
    assert len(payload["blob"].encode()) == payload["size"]
