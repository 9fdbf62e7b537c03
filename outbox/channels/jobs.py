"""The built-in channel jobs: cronbox.sms, cronbox.email, cronbox.notify."""
from __future__ import annotations

import json

from sqlalchemy.orm import Session

from outbox.channels.models import Notification
from outbox.core import clock
from outbox.core.db import insert_ignore
from outbox.core.errors import PermanentFailure
from outbox.queue.jobs import job

from outbox.channels import email, sms
from outbox.channels.config import channel_config


def _text(payload, name: str, *, limit: int, required: bool = True) -> str | None:
    value = payload.get(name) if isinstance(payload, dict) else None
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise PermanentFailure(f"payload field {name!r} must be a non-empty string of at most {limit} characters")
    return value


@job("sms", name="cronbox.sms", tries=5, backoff=30, timeout=60, channel="sms",
     rate_limit=lambda settings: channel_config(settings).sms_rate)
def send_sms(payload, ctx):
    """payload: {"to": "+98912...", "text": "..."}"""
    to = _text(payload, "to", limit=32)
    text = _text(payload, "text", limit=1600)
    sms.driver_for(channel_config(ctx.settings)).send(ctx, to, text)


@job("mail", name="cronbox.email", tries=5, backoff=60, timeout=90, channel="mail",
     rate_limit=lambda settings: channel_config(settings).mail_rate)
def send_email(payload, ctx):
    """payload: {"to": "a@b.c", "subject": "...", "text": "...", "html": optional}"""
    email.send(channel_config(ctx.settings), ctx, to=_text(payload, "to", limit=254),
               subject=_text(payload, "subject", limit=255), text=_text(payload, "text", limit=1_000_000),
               html=_text(payload, "html", limit=2_000_000, required=False))


@job("notifications", name="cronbox.notify", tries=5, backoff=5, timeout=30)
def notify(payload, ctx):
    """payload: {"to": recipient id, "kind": "...", "title": "...", "body": "...", "data": optional JSON}.
    Written through ctx.session with the job's idempotency key: exactly one row per job."""
    add_notification(ctx.session, recipient=_text(payload, "to", limit=191), kind=_text(payload, "kind", limit=64),
                     title=_text(payload, "title", limit=255), body=_text(payload, "body", limit=65000),
                     data=payload.get("data"), dedupe_key=ctx.idempotency_key)


def add_notification(session: Session, *, recipient: str, kind: str, title: str, body: str, data=None,
                     dedupe_key: str | None = None) -> None:
    insert_ignore(session, Notification.__table__, {
        "recipient": recipient, "kind": kind, "title": title, "body": body,
        "data": json.dumps(data) if data is not None else None, "dedupe_key": dedupe_key,
        "created_at": clock.utcnow(),
    })
