"""Queues: per queue ready / delayed / reserved / failed; paused channels; concurrency groups and cost
budgets; handler profiles (admission) and the last worker pools; failed jobs; retry, forget, flush, resume."""
from __future__ import annotations

from flask import abort, render_template, request

from cronbox.cron.scheduling import once as once_requests
from cronbox.outbox.core import clock, paging
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine import heartbeat, profiles
from cronbox.outbox.queue import groups, jobstore, pauses
from cronbox.outbox.queue.jobs import QUEUE_NAME
from cronbox.web.state import runtime

from .. import bp
from ..guard import act, confirm_page, confirmed, done, form_ids, id_list, operator_name, unchanged_note

POOL_RUNS = 5  # the last worker pools shown


def _queue_arg(value: str | None) -> str | None:
    if not value:
        return None
    if not QUEUE_NAME.match(value):
        abort(400, description="not a queue name")
    return value


@bp.get("/queues")
def queues():
    rt = runtime()
    now = clock.utcnow()
    only = _queue_arg(request.args.get("queue"))
    cursor = paging.parse_cursor(request.args.get("after"), jobstore.FAILED_KEY)
    window = profiles.ProfileSettings.of(rt.settings)
    rows, paused, in_groups, spent, page, handlers, pools = in_transaction(rt.sessions, lambda s: (
        jobstore.overview(s, rt.listed_queues(), now), pauses.active(s, now), groups.overview(s, rt.jobs, now),
        groups.budget_overview(s, rt.settings, now), jobstore.failed_page(s, cursor, queue=only),
        profiles.overview(s, window, now), heartbeat.recent(s, "pool", POOL_RUNS)))
    return render_template("cronbox_ops/queues.html", queues=rows, paused=paused, groups=in_groups, budgets=spent,
                           page=page, only=only, now=now, profiles=handlers, pools=pools)


@bp.post("/queues/resume")
def queues_resume():
    """Lift a channel's pause now (the operator fixed its cause); the jobs it held back run at the next tick."""
    channel = request.form.get("channel", "")
    if not channel or len(channel) > 32:
        abort(400, description="not a channel name")
    rt = runtime()
    moved = act("queue.resume", channel, lambda s: pauses.lift(s, rt.jobs, channel, clock.utcnow()),
                outcome=lambda result: "ok" if result is not None else "not-paused")
    if moved is None:
        return done(f"Channel {channel} is not paused.", "ops.queues")
    return done(f"Channel {channel} resumed; {moved} waiting jobs run at the next tick.", "ops.queues")


@bp.post("/queues/retry")
def queues_retry():
    everything = request.form.get("all") == "yes"
    only = _queue_arg(request.form.get("queue"))
    ids = None if everything else form_ids()
    if ids == []:
        return done("Choose jobs to retry.", "ops.queues")
    target = (f"all failed of {only}" if only else "all failed") if everything else id_list(ids)
    count, unknown = act("queue.retry", target, lambda s: jobstore.retry_failed(s, ids, only, clock.utcnow()))
    return done(f"{count} jobs queued again; the next tick runs them." + unchanged_note(unknown), "ops.queues")


@bp.post("/queues/forget")
def queues_forget():
    ids = form_ids()
    if not ids:
        return done("Choose jobs to forget.", "ops.queues")
    if not confirmed():
        return confirm_page("Forget failed jobs?", f"Delete {len(ids)} failed job{'s' if len(ids) > 1 else ''} "
                                                   f"({id_list(ids)}) for good? They will not run again.", "Forget")
    count, unknown = act("queue.forget", id_list(ids), lambda s: jobstore.forget(s, ids))
    return done(f"{count} failed jobs deleted." + unchanged_note(unknown), "ops.queues")


@bp.post("/queues/flush")
def queues_flush():
    """Queued as a one-off `queue flush` (bounded batches, its own output), not run inside this request:
    a shared host may kill a long request half-way, and the run records what it deleted."""
    if not confirmed():
        return confirm_page("Flush failed jobs?", "Delete every failed job, on every queue, for good? "
                                                  "None of them will run again. The next tick does it.",
                            "Flush all failed jobs")
    row = act("queue.flush", "all failed", lambda s: once_requests.add(s, ["queue", "flush"],
                                                                      source=f"console:{operator_name()}"))
    return done(f"Every failed job will be deleted at the next tick (one-off run #{row.id}).", "ops.once")
