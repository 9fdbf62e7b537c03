"""Admin alerts: a message to the operator by e-mail and/or SMS, as jobs, unique per problem.

The unique key makes a second alert about the same problem a no-op while the
first is still waiting or running; callers decide how often a problem may be
repeated (health: once an hour) by putting a time bucket in the key.
"""
from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from outbox.channels.config import channel_config
from outbox.channels.jobs import send_email, send_sms

log = logging.getLogger("cronbox")


def admin_alert(session: Session, settings, *, key: str, subject: str, body: str,
                skip_channel: str | None = None) -> list[str]:
    """Dispatch the alert in the caller's transaction; returns the channels used."""
    config = channel_config(settings)
    used = []
    if config.admin_email and skip_channel != "mail":
        if send_email.dispatch(session, {"to": config.admin_email, "subject": f"[cronbox] {subject}",
                                         "text": body}, unique_key=f"alert:{key}") is not None:
            used.append("mail")
    if config.admin_phone and skip_channel != "sms":
        if send_sms.dispatch(session, {"to": config.admin_phone, "text": f"cronbox: {subject}"[:320]},
                             unique_key=f"alert:{key}") is not None:
            used.append("sms")
    if not (config.admin_email or config.admin_phone):
        log.warning("admin alert %r not sent: set CRONBOX_ADMIN_EMAIL or CRONBOX_ADMIN_PHONE", key)
    return used
