"""Outbox: per consumer pending / due / dead / blocked keys; dead deliveries; retry or skip, one or all."""
from __future__ import annotations

from datetime import datetime

from flask import render_template, request
from sqlalchemy import select

from outbox.core import clock
from outbox.core.db import in_transaction
from outbox.events import deliveries
from outbox.events.models import DEAD, Delivery, OutboxEvent
from web import runtime

from .. import bp, paging
from ..guard import act, confirm_page, confirmed, done, form_ids, id_list, unchanged_note

D, E = Delivery.__table__, OutboxEvent.__table__
# Newest attempt first; served by the (status, next_attempt_at, id) index.
ORDER = (D.c.next_attempt_at, D.c.id)
INDEX = "ix_cronbox_deliveries_status_next_attempt_at_id"


@bp.get("/outbox")
def outbox():
    rt = runtime()
    now = clock.utcnow()
    cursor = paging.parse_cursor(request.args.get("after"), (datetime, int))
    dead_rows = (select(D.c.id, D.c.consumer, D.c.key, D.c.attempts, D.c.last_error, D.c.next_attempt_at,
                        D.c.finished_at, E.c.id.label("event_id"), E.c.type, E.c.trace_id)
                 .join(E, E.c.id == D.c.event_id).where(D.c.status == DEAD))

    def read(s):
        return (deliveries.status(s, now), deliveries.unfanned_count(s), deliveries.blocked_keys(s),
                paging.page(s, dead_rows, ORDER, cursor, index=INDEX))

    per_consumer, unfanned, blocked, page = in_transaction(rt.sessions, read)
    registered = set(rt.consumers.names())
    names = sorted(set(per_consumer) | registered)
    consumers = [(n, n in registered, per_consumer.get(n) or deliveries.ConsumerStatus(n)) for n in names]
    return render_template("ops/outbox.html", consumers=consumers, unfanned=unfanned, blocked=blocked, page=page,
                           now=now)


@bp.post("/outbox/retry")
def outbox_retry():
    everything = request.form.get("all") == "yes"
    ids = None if everything else form_ids()
    if ids == []:
        return done("Choose deliveries to retry.", "ops.outbox")
    revived, unknown = act("outbox.retry", "all dead" if everything else id_list(ids),
                           lambda s: deliveries.retry(s, ids, clock.utcnow()))
    return done(f"{revived} deliveries pending again." + unchanged_note(unknown), "ops.outbox")


@bp.post("/outbox/skip")
def outbox_skip():
    everything = request.form.get("all") == "yes"
    ids = None if everything else form_ids()
    if ids == []:
        return done("Choose deliveries to skip.", "ops.outbox")
    if not confirmed():
        what = "every dead delivery" if everything else f"{len(ids)} deliver{'y' if len(ids) == 1 else 'ies'} ({id_list(ids)})"
        message = (f"Skip {what}? Their consumers will never receive these events, and keys they hold are "
                   "released.")
        if not everything:
            return confirm_page("Skip deliveries?", message, "Skip")
        # "All" means all that were dead when the operator looked, not ones that died since.
        upto = in_transaction(runtime().sessions, deliveries.last_dead_id)
        if upto is None:
            return done("No dead deliveries to skip.", "ops.outbox")
        return confirm_page("Skip deliveries?", message, "Skip", upto=str(upto))
    upto = form_ids("upto")[0] if everything and request.form.get("upto") else None
    skipped, unknown = act("outbox.skip", "all dead" if everything else id_list(ids),
                           lambda s: deliveries.skip(s, ids, clock.utcnow(), upto=upto))
    return done(f"{skipped} deliveries skipped." + unchanged_note(unknown), "ops.outbox")
