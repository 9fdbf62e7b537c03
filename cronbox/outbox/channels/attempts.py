"""The send-attempt log: one row per try, with the provider's answer and never the content.

Written through the job's ctx.session and committed at once with ctx.commit_now() (before any further
network call), so failed attempts are kept too and no transaction stays open
while we wait on a provider.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from cronbox.outbox.channels.models import SendAttempt
from cronbox.outbox.core import clock
from cronbox.outbox.core.logs import mask_phone
from cronbox.outbox.core.text import NAME_MAX

A = SendAttempt.__table__


def record(ctx, *, channel: str, recipient: str, outcome: str, http_status: int | None = None,
           provider_status: str | None = None, provider_id: str | None = None, detail: str | None = None) -> None:
    ctx.session.add(SendAttempt(
        channel=channel, idempotency_key=ctx.idempotency_key, recipient_masked=mask_recipient(recipient)[:64],
        outcome=outcome, http_status=http_status, provider_status=(provider_status or None) and provider_status[:64],
        provider_id=(provider_id or None) and str(provider_id)[:NAME_MAX], detail=(detail or None) and detail[:500],
        created_at=clock.utcnow()))
    ctx.commit_now()


def previous(ctx, channel: str) -> list[tuple[str, datetime]]:
    """(outcome, when) of earlier attempts of this job; the read transaction is ended before returning,
    as the caller's next step is a network call."""
    rows = [(r.outcome, r.created_at) for r in ctx.session.execute(
        select(A.c.outcome, A.c.created_at).where(A.c.idempotency_key == ctx.idempotency_key,
                                                  A.c.channel == channel).order_by(A.c.id))]
    ctx.commit_now()
    return rows


def unknown_since(rows: list[tuple[str, datetime]]) -> datetime | None:
    """When the first send with an unknown outcome went out: a "sending" row followed by "unknown",
    or by nothing at all (the job timed out or the process was killed mid-request)."""
    for index, (outcome, at) in enumerate(rows):
        if outcome != "sending":
            continue
        following = rows[index + 1][0] if index + 1 < len(rows) else None
        if following in (None, "sending", "unknown"):
            return at
    return None


def mask_recipient(recipient: str) -> str:
    if recipient.startswith(("https://", "http://")):
        return recipient  # a webhook's scheme://host (webhook.where): its path and query never get here
    if "@" in recipient:
        name, _, domain = recipient.partition("@")
        return f"{name[:1]}***@{domain}"
    return mask_phone(recipient)
