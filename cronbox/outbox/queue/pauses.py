"""Channel pauses: a provider said "out of credit" or "bad credentials", so nobody sends for a while.

Shared by every worker through the database. Jobs of a paused channel wait via
RetryLater (no attempt used) instead of each burning an attempt on the same
answer. Pausing also dispatches one admin alert, unique per channel while it waits.
A pause ends by itself at `paused_until`, or when the operator lifts it (`queue resume CHANNEL`,
the console's Queues page) after fixing its cause.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from cronbox.outbox.core.errors import RetryLater
from cronbox.outbox.core.sql import insert_ignore
from cronbox.outbox.engine.registry import Jobs
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.models import ChannelPause

log = logging.getLogger("cronbox")
P = ChannelPause.__table__
# A job held back by a pause was rescheduled to the pause's end as read a moment before (the gate's
# clock, then the reschedule's): it may sit a little past `paused_until`.
DEFER_SLACK = timedelta(seconds=60)


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


@dataclass(frozen=True)
class Pause:
    channel: str
    paused_until: datetime
    reason: str
    since: datetime


def active(session: Session, now: datetime) -> list[Pause]:
    """Channels paused now, by name: what `queue status`, `health` and the console show."""
    rows = session.execute(select(P.c.channel, P.c.paused_until, P.c.reason, P.c.created_at)
                           .where(P.c.paused_until > now).order_by(P.c.channel))
    return [Pause(*row) for row in rows]


def channels(registry: Jobs) -> set[str]:
    """Channels some registered job sends through."""
    return {h.channel for h in registry.all() if h.channel is not None}


def lift(session: Session, registry: Jobs, channel: str, now: datetime) -> int | None:
    """End a channel's pause and make the jobs it held back due now (no attempt used: they never
    called the provider). None when the channel was not paused (a stale row is removed all the same).
    If the cause is not fixed, the next send pauses the channel again."""
    until = session.scalar(select(P.c.paused_until).where(P.c.channel == channel))
    if until is None:
        return None
    resume(session, channel)
    if until <= now:
        return None
    handlers = [h for h in registry.all() if h.channel == channel]
    moved = jobstore.hasten(session, handlers, until + DEFER_SLACK, now)
    log.warning("channel %s resumed by the operator; %d waiting jobs due now", channel, moved)
    return moved
