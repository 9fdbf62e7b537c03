"""Files: the PHI access audit (filter by file, subject, outcome) and grants, with revoke.

Never file contents, never a signed link or token. File names are sealed
(they can be PHI themselves: "HIV test.pdf"), so they stay hidden unless
CRONBOX_OPS_SHOW_FILE_NAMES=on says this operator may see them; then the
names of the files on the page are unsealed, nothing else, each one audited
("show-name": who, from where, which file), and shown as a download would save them (cronbox.web.disposition: no control or bidi characters).
Subjects and details are shown without those characters too (storage.display).
"""
from __future__ import annotations

from datetime import datetime

from flask import abort, current_app, render_template, request

from cronbox.outbox.core import clock, paging
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.core.transactions import in_transaction
from cronbox.storage import audit, grants
from cronbox.storage.display import shown
from cronbox.storage.errors import StorageError
from cronbox.web.state import runtime
from cronbox.web.disposition import clean_name

from .. import bp
from ..guard import act, client, confirm_page, confirmed, done, operator_name



def _filter(name: str) -> str | None:
    value = (request.args.get(name) or "").strip()
    if len(value) > NAME_MAX:
        abort(400, description=f"the {name} filter is too long")
    return value or None


def show_names() -> bool:
    return current_app.extensions["cronbox"].settings.ops_show_file_names


def _names(session, file_ids: set[str]) -> dict[str, str]:
    """What a download would save each file as (no control or bidi characters), when names are shown;
    each name unsealed is audited in the page's read transaction (storage's `names`)."""
    if not show_names():
        return {}
    who = audit.Client(client(), request.headers.get("User-Agent"))
    names = current_app.extensions["cronbox"].storage.names(session, file_ids, client=who, actor=operator_name())
    return {i: clean_name(n) if n is not None else "(cannot unseal)" for i, n in names.items()}


STATES = {None: "active", "revoked": "revoked", "grant-expired": "expired", "exhausted": "used up"}


def grant_state(grant, now: datetime) -> str:
    return STATES[grants.refusal(grant, now)]


@bp.get("/files")
def files():
    now = clock.utcnow()
    file_id, subject, outcome = _filter("file"), _filter("subject"), _filter("outcome")
    cursor = paging.parse_cursor(request.args.get("after"), (int,))
    grants_cursor = paging.parse_cursor(request.args.get("grants_after"), grants.PAGE_KEY)
    def read(s):
        audit_page = audit.page(s, cursor, file_id=file_id, subject=subject, outcome=outcome)
        grants_page = grants.page(s, grants_cursor, file_id=file_id, subject=subject)
        ids = {r.file_id for r in audit_page.rows if r.file_id} | {r.file_id for r in grants_page.rows}
        return audit_page, grants_page, _names(s, ids)

    audit_page, grants_page, names = in_transaction(runtime().sessions, read)
    filters = {k: v for k, v in (("file", file_id), ("subject", subject), ("outcome", outcome)) if v}
    return render_template("cronbox_ops/files.html", page=audit_page, grants=grants_page, names=names, filters=filters,
                           grant_state=grant_state, now=now, show_names=show_names(), shown=shown)


@bp.post("/files/revoke")
def files_revoke():
    grant_id = request.form.get("grant", "")
    if not grant_id or len(grant_id) > 64:
        abort(400, description="say which grant (its id)")
    if not confirmed():
        return confirm_page("Revoke grant?", f"Revoke grant {grant_id}? Every link issued for it stops working "
                                             "at once.", "Revoke")
    st = current_app.extensions["cronbox"].storage
    who = audit.Client(client(), request.headers.get("User-Agent"))
    try:
        changed = act("files.revoke", grant_id, lambda s: st.revoke(s, grant_id, client=who, actor=operator_name()),
                      outcome=lambda changed: "ok" if changed else "already-revoked")
    except StorageError:
        return done(f"No grant {grant_id}.", "ops.files")
    return done(f"Grant {grant_id} revoked." if changed else f"Grant {grant_id} was already revoked.", "ops.files")
