"""The built-in channel jobs (cronbox.sms, cronbox.email, cronbox.notify, cronbox.webhook) and the admin
alerts sent through them.

Admin alerts: a message to the operator by e-mail, SMS and/or a signed webhook, as jobs, unique per problem.
The unique key makes a second alert about the same problem a no-op while the first is still
waiting or running; callers decide how often a problem may be repeated (health: once an hour)
by putting a time bucket in the key.

Every tick and worker imports this module (the jobs must be registered to be run), most send
nothing: each job imports its driver (smtplib, http.client, the attempts' table) when it first runs.
"""
from __future__ import annotations

import json
import logging
import socket

from sqlalchemy.orm import Session

from cronbox.outbox.channels.config import channel_config
from cronbox.outbox.channels.errors import UnknownAfterLookup
from cronbox.outbox.channels.models import Notification
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import PermanentFailure
from cronbox.outbox.core.sealing import BY_DEFAULT  # sealed where a key vault is usable: they carry PHI
from cronbox.outbox.core.sql import insert_ignore
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.engine.registry import DEFAULT
from cronbox.outbox.queue.jobs import job

log = logging.getLogger("cronbox")


def _text(payload, name: str, *, limit: int, required: bool = True) -> str | None:
    value = payload.get(name) if isinstance(payload, dict) else None
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise PermanentFailure(f"payload field {name!r} must be a non-empty string of at most {limit} characters")
    return value


@job("sms", name="cronbox.sms", tries=5, backoff=30, timeout=60, channel="sms", sealed=BY_DEFAULT,
     rate_limit=lambda settings: channel_config(settings).sms_rate)
def send_sms(payload, ctx):
    """An SMS through the configured driver (CRONBOX_SMS_DRIVER). payload: {"to": "+98912...", "text": "..."}.
    Dispatch it (`send_sms.dispatch(session, payload)`); the worker calls it with the job's `ctx`."""
    to = _text(payload, "to", limit=32)
    text = _text(payload, "text", limit=1600)
    from cronbox.outbox.channels import sms

    try:
        sms.driver_for(channel_config(ctx.settings)).send(ctx, to, text)
    except UnknownAfterLookup as exc:
        admin_alert(ctx.session, ctx.settings, key=f"sms-outcome-unknown:{ctx.idempotency_key}", check="sms.outcome",
                    subject="SMS outcome unknown",
                    body=f"{ctx.idempotency_key} (trace {ctx.trace_id}) to {exc.recipient} timed out and could not "
                         f"be looked up ({exc.why}). It may have been sent; it will not be resent.")
        ctx.commit_now()  # the attempt and the alert stay, though the job fails
        raise


@job("mail", name="cronbox.email", tries=5, backoff=60, timeout=90, channel="mail", sealed=BY_DEFAULT,
     rate_limit=lambda settings: channel_config(settings).mail_rate)
def send_email(payload, ctx):
    """An e-mail through SMTP (or the log driver). payload: {"to": "a@b.c", "subject": "...", "text": "...",
    "html": optional}. Dispatch it; the worker calls it with the job's `ctx`."""
    from cronbox.outbox.channels import email

    email.send(channel_config(ctx.settings), ctx, to=_text(payload, "to", limit=254),
               subject=_text(payload, "subject", limit=255), text=_text(payload, "text", limit=1_000_000),
               html=_text(payload, "html", limit=2_000_000, required=False))


@job("webhook", name="cronbox.webhook", tries=8, backoff=30, timeout=60, channel="webhook", sealed=BY_DEFAULT)
def send_webhook(payload, ctx):
    """payload: {"check", "status", "message", "time", "host", "recovery"}: posted as JSON, signed
    (outbox/channels/webhook.py). Dispatched by admin_alert, not meant for other messages; the worker
    calls it with the job's `ctx`."""
    if not isinstance(payload, dict) or not isinstance(payload.get("recovery"), bool):
        raise PermanentFailure("payload must be an alert: check, status, message, time, host, recovery")
    fields = {name: _text(payload, name, limit=4000) for name in ("check", "status", "message", "time", "host")}
    from cronbox.outbox.channels import webhook

    webhook.send(channel_config(ctx.settings), ctx, {**fields, "recovery": payload["recovery"]})


@job("notifications", name="cronbox.notify", tries=5, backoff=5, timeout=30, sealed=BY_DEFAULT)
def notify(payload, ctx):
    """payload: {"to": recipient id, "kind": "...", "title": "...", "body": "...", "data": optional JSON}.
    Written through `ctx.session` (the job's) with the job's idempotency key: exactly one row per job."""
    add_notification(ctx.session, recipient=_text(payload, "to", limit=NAME_MAX), kind=_text(payload, "kind", limit=64),
                     title=_text(payload, "title", limit=255), body=_text(payload, "body", limit=65000),
                     data=payload.get("data"), dedupe_key=ctx.idempotency_key)


def add_notification(session: Session, *, recipient: str, kind: str, title: str, body: str, data=None,
                     dedupe_key: str | None = None) -> None:
    insert_ignore(session, Notification.__table__, {
        "recipient": recipient, "kind": kind, "title": title, "body": body,
        "data": json.dumps(data) if data is not None else None, "dedupe_key": dedupe_key,
        "created_at": clock.utcnow(),
    })


def admin_alert(session: Session, settings, *, key: str, subject: str, body: str,
                skip_channel: str | None = None, check: str | None = None, status: str = "fail",
                recovery: bool = False) -> list[str]:
    """Dispatch the alert in the caller's transaction; returns the channels used.
    `check`, `status`, `recovery`: what the webhook's JSON says (the check defaults to the key's
    first part, e.g. "channel-paused")."""
    config = channel_config(settings)
    used = []
    if config.webhook_url and skip_channel != "webhook":
        payload = {"check": (check or key.partition(":")[0])[:200], "status": status, "message": f"{subject}: {body}"[:4000],
                   "time": clock.utcnow().isoformat(timespec="seconds") + "Z", "host": socket.gethostname()[:255] or "?",
                   "recovery": recovery}
        if send_webhook.dispatch(session, payload, unique_key=f"alert:{key}") is not None:
            used.append("webhook")
    if config.admin_email and skip_channel != "mail":
        if send_email.dispatch(session, {"to": config.admin_email, "subject": f"[cronbox] {subject}",
                                         "text": body}, unique_key=f"alert:{key}") is not None:
            used.append("mail")
    if config.admin_phone and skip_channel != "sms":
        if send_sms.dispatch(session, {"to": config.admin_phone, "text": f"cronbox: {subject}"[:320]},
                             unique_key=f"alert:{key}") is not None:
            used.append("sms")
    if not (config.admin_email or config.admin_phone or config.webhook_url):
        log.warning("admin alert %r not sent: set CRONBOX_ADMIN_EMAIL, CRONBOX_ADMIN_PHONE or "
                    "CRONBOX_ALERT_WEBHOOK_URL", key)
    return used


@DEFAULT.on_channel_pause
def alert_on_pause(session: Session, settings, channel: str, seconds: float, reason: str) -> None:
    """A paused channel tells the operator once (unique per channel while the alert waits), by the
    other channel: an SMS provider out of credit cannot carry its own alert."""
    admin_alert(session, settings, key=f"channel-paused:{channel}", subject=f"{channel} channel paused",
                check=f"channel.{channel}", status="warn",
                body=f"The {channel} channel stopped sending for {seconds:.0f}s: {reason}. "
                     f"Jobs wait and resume by themselves; once the cause is fixed, `queue resume {channel}` "
                     "(or Resume on the console's Queues page) sends them at once.", skip_channel=channel)
