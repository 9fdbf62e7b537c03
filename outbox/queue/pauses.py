"""Channel pauses: a provider said "out of credit" or "bad credentials", so nobody sends for a while.

Shared by every worker through the database. Jobs of a paused channel wait via
RetryLater (no attempt used) instead of each burning an attempt on the same
answer. Pausing also dispatches one admin alert, unique per channel while it waits.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from outbox.core.db import insert_ignore
from outbox.core.errors import RetryLater
from outbox.queue.models import ChannelPause

log = logging.getLogger("cronbox")
P = ChannelPause.__table__


class ChannelPaused(RetryLater):
    """Raise from a channel when the provider refuses everything for a while (credit, credentials)."""

    def __init__(self, channel: str, seconds: float, reason: str):
        super().__init__(seconds, f"channel {channel} paused: {reason}")
        self.channel = channel
        self.pause_reason = reason


def remaining(session: Session, channel: str, now: datetime) -> float | None:
    until = session.scalar(select(P.c.paused_until).where(P.c.channel == channel))
    if until is None or until <= now:
        return None
    return (until - now).total_seconds()


def pause(session: Session, channel: str, seconds: float, reason: str, now: datetime) -> None:
    until = now + timedelta(seconds=seconds)
    insert_ignore(session, P, {"channel": channel, "paused_until": until, "reason": reason[:255], "created_at": now})
    session.execute(update(P).where(P.c.channel == channel, P.c.paused_until < until)
                    .values(paused_until=until, reason=reason[:255]))
    log.error("channel %s paused for %.0fs: %s", channel, seconds, reason)


def resume(session: Session, channel: str) -> bool:
    return session.execute(delete(P).where(P.c.channel == channel)).rowcount == 1
