"""Batches: their progress (done / failed / cancelled / pending, state), one batch's members by state;
retry its failed members, cancel it. The read model and the actions are `queue batches` / `queue batch
ID`'s (outbox.queue.batches, jobstore.retry_batch): one way to do each thing."""
from __future__ import annotations

from flask import abort, render_template, request

from cronbox.outbox.core import clock, paging
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.queue import batches, jobstore
from cronbox.web.state import runtime

from .. import bp
from ..guard import act, confirm_page, confirmed, done, form_ids


@bp.get("/batches", endpoint="batches")
def batches_list():
    cursor = paging.parse_cursor(request.args.get("after"), batches.MEMBER_KEY)

    def read(session):
        page = batches.page(session, cursor)
        return page, batches.progress_of(session, page.rows)

    page, shown = in_transaction(runtime().sessions, read)
    return render_template("cronbox_ops/batches.html", page=page, batches=shown, now=clock.utcnow())


@bp.get("/batches/<cronbox_id:batch_id>")
def batches_show(batch_id: int):
    if batch_id > paging.MAX_ID:
        abort(404)
    state = request.args.get("state") or None
    if state is not None and state not in batches.MEMBER_STATES:
        abort(400, description="not a member state")
    cursor = paging.parse_cursor(request.args.get("after"), batches.MEMBER_KEY)
    found, page = in_transaction(runtime().sessions, lambda s: (
        batches.progress(s, batch_id), batches.members_page(s, batch_id, cursor, status=state)))
    if found is None:
        abort(404)
    return render_template("cronbox_ops/batch_show.html", batch=found, page=page, state=state,
                           states=batches.MEMBER_STATES, now=clock.utcnow())


def _one_batch() -> int:
    ids = form_ids()
    if len(ids) != 1:
        abort(400, description="give one batch id")
    return ids[0]


@bp.post("/batches/retry")
def batches_retry():
    """The batch's failed (and cancelled) members back on their queues; the batch opens again."""
    batch_id = _one_batch()
    count = act("batch.retry", f"batch #{batch_id}", lambda s: jobstore.retry_batch(s, batch_id, clock.utcnow()),
                outcome=lambda n: "ok" if n else "nothing-failed")
    return done(f"{count} failed members of batch {batch_id} queued again; the next tick runs them.",
                "ops.batches_show", batch_id=batch_id)


@bp.post("/batches/cancel")
def batches_cancel():
    batch_id = _one_batch()
    if not confirmed():
        return confirm_page("Cancel the batch?", f"Cancel batch {batch_id}? Its members not started yet never "
                                                 "start; the running ones finish, then its finally callback runs "
                                                 "(its then never does).", "Cancel the batch")
    stopped, after = act("batch.cancel", f"batch #{batch_id}", lambda s: batches.cancel_running(
        s, batch_id, clock.utcnow()), outcome=lambda result: "ok" if result[0] is not None else "not-running")
    if after is None:
        return done(f"No batch {batch_id}.", "ops.batches")
    if stopped is None:
        return done(f"Batch {batch_id} is {after.state}: nothing to cancel.", "ops.batches_show", batch_id=batch_id)
    return done(f"Batch {batch_id} cancelled; {stopped} members not started stopped.", "ops.batches_show",
                batch_id=batch_id)
