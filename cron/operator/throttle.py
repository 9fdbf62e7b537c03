"""Login throttling: at most a few password (or setup token) tries per client, and a ceiling for all.

Each try takes a slot of a fixed-window counter (outbox.queue.ratelimit, shared by
every web process through the database) *before* the password is checked, so
parallel guesses cannot slip past the limit; a right password gives its slots
back, in the windows it took them from. The client is its IP as the web app
resolved it per CRONBOX_TRUSTED_PROXIES (cronbox.client); IPv6 clients count per /64, the block
one subscriber gets, so rotating addresses inside it buys nothing. The global
ceiling stops a guesser with many networks; it can lock the operator out for
the rest of the window too, which `ops unlock` (a cron line) undoes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.orm import Session

from outbox.core.db import starts_with
from outbox.queue.models import RateWindow
from outbox.queue.ratelimit import RateLimit, client_key

PER_CLIENT = (5, 15 * 60)  # tries per window (seconds)
OVERALL = (50, 15 * 60)
PREFIX = "ops-login:"


def _limits(client_ip: str | None) -> list[RateLimit]:
    return [RateLimit(f"{PREFIX}{client_key(client_ip)}"[:64], PER_CLIENT[0], PER_CLIENT[1]),
            RateLimit(f"{PREFIX}*", OVERALL[0], OVERALL[1])]


@dataclass
class Ticket:
    """The outcome of take(): `wait` seconds when refused, else the slots to give back on success."""

    wait: int | None
    taken: list[tuple[RateLimit, int]] = field(default_factory=list)
    first_refusal: bool = False  # the first refused try of this client in this window (worth recording)


def take(session: Session, client_ip: str | None, now: datetime) -> Ticket:
    """Take a try (call in its own transaction)."""
    taken: list[tuple[RateLimit, int]] = []
    for limit in _limits(client_ip):
        wait = limit.acquire(session, now)
        if wait is not None:
            for earlier, window in taken:
                earlier.refund(session, window)
            return Ticket(max(1, math.ceil(wait)), first_refusal=limit.first_refusal(session, now))
        taken.append((limit, limit.window_of(now)))
    return Ticket(None, taken)


def give_back(session: Session, ticket: Ticket) -> None:
    for limit, window in ticket.taken:
        limit.refund(session, window)


def unlock(session: Session) -> int:
    """Forget every login counter (`ops unlock`)."""
    R = RateWindow.__table__
    return session.execute(delete(R).where(starts_with(R.c.bucket, PREFIX))).rowcount
