"""Activity: the operator action log, newest first."""
from __future__ import annotations

from flask import render_template, request
from sqlalchemy import select

from cron.operator.models import OperatorAction
from outbox.core.db import in_transaction
from web import runtime

from .. import bp, paging

A = OperatorAction.__table__


@bp.get("/activity")
def activity():
    cursor = paging.parse_cursor(request.args.get("after"), (int,))
    rows = select(A.c.id, A.c.at, A.c.operator, A.c.action, A.c.target, A.c.outcome, A.c.detail, A.c.client_ip)
    page = in_transaction(runtime().sessions, lambda s: paging.page(s, rows, (A.c.id,), cursor))
    return render_template("ops/activity.html", page=page)
