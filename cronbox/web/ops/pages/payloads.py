"""One job's or event's payload: masked (`sealed (N bytes, key K)`), and revealed only by a POST that
names a reason, written to the file audit trail with the operator and their address first
(cronbox.storage.payload_reveal)."""
from __future__ import annotations

from flask import abort, render_template, request

from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.sealing import EVENTS, JOBS
from cronbox.storage import audit
from cronbox.storage.payload_reveal import MAX_REASON, show
from cronbox.web.state import runtime

from .. import bp
from ..guard import client, operator_name

TABLES = {"job": JOBS, "event": EVENTS}


def _table(kind: str) -> str:
    if kind not in TABLES:
        abort(404)
    return TABLES[kind]


@bp.get("/payload/<kind>/<int:row_id>")
def payload(kind: str, row_id: int):
    try:
        shown = show(runtime(), _table(kind), row_id)
    except CronboxError:
        abort(404)
    return render_template("cronbox_ops/payload.html", kind=kind, shown=shown, max_reason=MAX_REASON, error=None)


@bp.post("/payload/<kind>/<int:row_id>")
def payload_reveal(kind: str, row_id: int):
    table = _table(kind)
    reason = (request.form.get("reason") or "").strip()
    who = audit.Client(client(), request.headers.get("User-Agent"))
    try:
        if not reason or len(reason) > MAX_REASON:
            shown, error = show(runtime(), table, row_id), f"Say why (1 to {MAX_REASON} characters): it is audited."
        else:
            shown, error = show(runtime(), table, row_id, reveal=True, actor=f"console:{operator_name()}",
                                reason=reason, client=who), None
    except CronboxError:
        abort(404)
    return render_template("cronbox_ops/payload.html", kind=kind, shown=shown, max_reason=MAX_REASON, error=error)
