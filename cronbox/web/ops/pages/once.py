"""One-off runs: ask for an allow-listed command (e.g. `migrate`); pending and finished runs with output."""
from __future__ import annotations

import json

from flask import abort, render_template, request

from cronbox.cron.scheduling import once as once_requests
from cronbox.outbox.core import clock, paging
from cronbox.outbox.core.transactions import in_transaction
from cronbox.web.state import runtime

from .. import bp
from ..guard import act, confirm_page, confirmed, done, operator_name

COMMAND_MAX = 500
# Allow-listed commands that delete or rewrite stored data: the console asks before queueing them.
DESTRUCTIVE = {("outbox", "skip"), ("outbox", "prune"), ("queue", "forget"), ("queue", "flush"),
               ("queue", "prune"), ("storage", "rewrap"), ("storage", "sweep")}


def argv_text(argv_json: str) -> str:
    try:
        return " ".join(json.loads(argv_json)) or "-"
    except ValueError:
        return "?"


@bp.get("/once")
def once():
    cursor = paging.parse_cursor(request.args.get("after"), (int,))
    page = in_transaction(runtime().sessions, lambda s: once_requests.page(s, cursor))
    allowed = [" ".join(p) for p in once_requests.ALLOWED]
    return render_template("cronbox_ops/once.html", page=page, allowed=allowed, argv_text=argv_text, now=clock.utcnow(),
                           command=request.args.get("command", ""))


@bp.post("/once")
def once_add():
    text = request.form.get("command", "").strip()
    if not text:
        return done("Type a command, e.g. migrate.", "ops.once")
    if len(text) > COMMAND_MAX:
        abort(400, description=f"the command is longer than {COMMAND_MAX} characters")
    argv, problem = once_requests.parse(text)
    problem = problem or once_requests.allowed(argv or [])
    if problem:
        # Only the command's first words are kept: the rest is free text the operator typed.
        act("once.add", " ".join((argv or text.split())[:2])[:64], outcome="refused", detail=problem)
        return done(f"Not queued: {problem}.", "ops.once")
    if tuple(argv[:2]) in DESTRUCTIVE and not confirmed():
        return confirm_page("Run this command?", f"“{' '.join(argv)}” deletes or changes stored data for good. "
                                                 "Queue it for the next tick?", "Queue it")
    row = act("once.add", text[:255], lambda s: once_requests.add(s, argv, source=f"console:{operator_name()}"))
    return done(f"One-off run #{row.id} is pending; the next tick runs it.", "ops.once")


@bp.get("/once/<cronbox_id:request_id>")
def once_show(request_id: int):
    if request_id > paging.MAX_ID:
        abort(404)
    row = in_transaction(runtime().sessions, lambda s: once_requests.get(s, request_id))
    if row is None:
        abort(404)
    return render_template("cronbox_ops/once_show.html", row=row, command=argv_text(row.argv), now=clock.utcnow())
