"""Activity: the operator action log, newest first."""
from __future__ import annotations

from flask import render_template, request

from cronbox.cron.operator import actions
from cronbox.outbox.core import paging
from cronbox.outbox.core.transactions import in_transaction
from cronbox.web.state import runtime

from .. import bp


@bp.get("/activity")
def activity():
    cursor = paging.parse_cursor(request.args.get("after"), (int,))
    page = in_transaction(runtime().sessions, lambda s: actions.page(s, cursor))
    return render_template("cronbox_ops/activity.html", page=page)
