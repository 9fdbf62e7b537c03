"""Outbox: per consumer pending / due / dead / blocked keys; dead deliveries; retry or skip, one or all."""
from __future__ import annotations

from flask import render_template, request

from cronbox.outbox.core import clock, paging
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.events import deliveries
from cronbox.web.state import runtime

from .. import bp
from ..guard import act, confirm_page, confirmed, done, form_ids, id_list, unchanged_note

@bp.get("/outbox")
def outbox():
    rt = runtime()
    now = clock.utcnow()
    cursor = paging.parse_cursor(request.args.get("after"), deliveries.DEAD_KEY)
    view, page = in_transaction(rt.sessions, lambda s: (deliveries.overview(s, rt.consumers, now),
                                                        deliveries.dead_page(s, cursor)))
    return render_template("cronbox_ops/outbox.html", consumers=view.consumers, unfanned=view.unfanned,
                           blocked=view.blocked, page=page, now=now)


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
