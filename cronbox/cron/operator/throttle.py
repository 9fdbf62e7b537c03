"""Login throttling: a budget of tries per client, and a global guard that slows but never locks out.

Each try takes a slot of the client's fixed-window counter (outbox.queue.ratelimit, shared by
every web process through the database) *before* the password is checked, so parallel guesses
cannot slip past the limit; a right password gives its slots back, in the windows it took them
from. The client is its IP as the web app resolved it per CRONBOX_TRUSTED_PROXIES
(cronbox.web.client); IPv6 clients count per /64, the block one subscriber gets, so rotating
addresses inside it buys nothing. A client over its own budget (PER_CLIENT) is refused until its
window ends: that is the only lock-out, and only its own failures cause it.

Other clients' failures never lock anyone out. They fill a global counter (OVERALL); once it is
full (a guesser with many networks), a client that has itself failed in this window may try only
once every PACE seconds until its own budget is spent, which makes distributed guessing slow. A
client with no failure of its own is never held back, so the operator with the right password
gets in however many addresses are guessing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.orm import Session

from cronbox.outbox.core.sql import starts_with
from cronbox.outbox.queue.models import RateWindow
from cronbox.outbox.queue.ratelimit import RateLimit, at_most_every, client_key

PER_CLIENT = (5, 15 * 60)  # tries per window (seconds)
OVERALL = (50, 15 * 60)  # tries by everyone per window, beyond which failed clients are paced
PACE = 30  # seconds between tries of a client that has failed, while the global counter is full
PREFIX = "ops-login:"


def _own_limit(client: str) -> RateLimit:
    return RateLimit(f"{PREFIX}{client}"[:64], PER_CLIENT[0], PER_CLIENT[1])


_GLOBAL = RateLimit(f"{PREFIX}*", OVERALL[0], OVERALL[1])


@dataclass
class Ticket:
    """The outcome of take(): `wait` seconds when refused, else the slots to give back on success."""

    wait: int | None
    taken: list[tuple[RateLimit, int]] = field(default_factory=list)
    first_refusal: bool = False  # the first refused try of this client in this window (worth recording)


def take(session: Session, client_ip: str | None, now: datetime) -> Ticket:
    """Take a try (call in its own transaction)."""
    client = client_key(client_ip)
    own = _own_limit(client)
    wait = own.acquire(session, now)
    if wait is not None:
        return Ticket(max(1, math.ceil(wait)), first_refusal=own.first_refusal(session, now))
    taken = [(own, own.window_of(now))]
    if _GLOBAL.acquire(session, now) is None:
        taken.append((_GLOBAL, _GLOBAL.window_of(now)))
    else:  # the global counter is full: every try is paced, but only a client that has failed waits
        paced = at_most_every(session, f"{PREFIX}pace:{client}", PACE, now)
        if paced is not None and own.used(session, now) > 1:
            own.refund(session, taken[0][1])
            return Ticket(max(1, math.ceil(paced)))
    return Ticket(None, taken)


def give_back(session: Session, ticket: Ticket) -> None:
    for limit, window in ticket.taken:
        limit.refund(session, window)


def unlock(session: Session) -> int:
    """Forget every login counter (`ops unlock`)."""
    R = RateWindow.__table__
    return session.execute(delete(R).where(starts_with(R.c.bucket, PREFIX))).rowcount
