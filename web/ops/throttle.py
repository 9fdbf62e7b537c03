"""Login throttling: at most a few password (or setup token) tries per client IP, and a ceiling for all.

Each try takes a slot of a fixed-window counter (outbox.ratelimit, shared by
every web process through the database) *before* the password is checked, so
parallel guesses cannot slip past the limit; a right password gives its slot
back. The client IP is resolved per CRONBOX_TRUSTED_PROXIES (web.client). The
global ceiling stops a guesser who rotates addresses; it can lock the operator
out for the rest of the window too, which is the lesser evil.
"""
from __future__ import annotations

import math
from datetime import datetime

from sqlalchemy.orm import Session

from outbox.ratelimit import RateLimit

PER_CLIENT = (5, 15 * 60)  # tries per window (seconds)
OVERALL = (50, 15 * 60)


def _limits(client_ip: str | None) -> list[RateLimit]:
    return [RateLimit(f"ops-login:{client_ip or '-'}"[:64], PER_CLIENT[0], PER_CLIENT[1]),
            RateLimit("ops-login:*", OVERALL[0], OVERALL[1])]


def take(session: Session, client_ip: str | None, now: datetime) -> int | None:
    """Take a try; None when allowed, else the whole seconds to wait. Call in its own transaction."""
    taken: list[RateLimit] = []
    for limit in _limits(client_ip):
        wait = limit.acquire(session, now)
        if wait is not None:
            for earlier in taken:
                earlier.refund(session, now)
            return max(1, math.ceil(wait))
        taken.append(limit)
    return None


def give_back(session: Session, client_ip: str | None, now: datetime) -> None:
    for limit in _limits(client_ip):
        limit.refund(session, now)
