"""Refused download tokens that nobody signed: recorded without letting a flood fill the audit table.

A token that is malformed or whose signature does not verify costs its sender
nothing to make, so anyone can send millions, and an audit row each would be
an unbounded table. Per client (its IP, IPv6 per /64) and fixed window of
WINDOW seconds, the first RECORDED such refusals are audited one by one as
before; the rest are only counted (a cronbox_rate_windows row, shared by every
web process), and once the window has ended `storage sweep` (hourly) writes
one entry with their number. The trail therefore still says who tried, when,
and how often.

Tokens whose signature verified (an expired link, a future-dated one, a
revoked or used-up grant) are never throttled: they come from a key we hold,
and each of their refusals is recorded.
"""
from __future__ import annotations

import calendar
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from cronbox.outbox.core.sql import starts_with
from cronbox.outbox.queue.models import RateWindow
from cronbox.outbox.queue.ratelimit import RateLimit, client_key

from . import audit

R = RateWindow.__table__
WINDOW = 600  # seconds
RECORDED = 20  # refusals per client and window audited one by one
PREFIX = "files-refused:"
UNSIGNED = frozenset({"malformed", "bad-signature"})  # the reasons that need no key to produce
COUNTED = "refusals-counted"  # the outcome of an aggregate entry
EPOCH = datetime(1970, 1, 1)


def _limit(client_ip: str | None) -> RateLimit:
    return RateLimit(f"{PREFIX}{client_key(client_ip)}"[:64], RECORDED, WINDOW)


def record(session: Session, reason: str, *, status: int, client: audit.Client, detail: str | None,
           now: datetime) -> str:
    """Audit one unsigned token's refusal, or count it. Returns "recorded", "counted" or, for the
    first refusal of a window that is only counted, "counting" (worth one log line)."""
    limit = _limit(client.ip)
    if limit.acquire(session, now) is None:
        audit.record(session, "redeem", reason, status=status, client=client, detail=detail)
        return "recorded"
    window = limit.window_of(now)
    session.execute(update(R).where(R.c.bucket == limit.bucket, R.c.window_start == window)
                    .values(used=R.c.used + 1))
    used = session.scalar(select(R.c.used).where(R.c.bucket == limit.bucket, R.c.window_start == window))
    return "counting" if used == RECORDED + 1 else "counted"


def flush(session: Session, now: datetime, batch: int) -> int:
    """Write one audit entry for each ended window with refusals that were only counted; returns how
    many. Each window's counter is reset to RECORDED by a guarded UPDATE first, so two concurrent
    sweeps never write the same window twice."""
    ended = calendar.timegm(now.timetuple()) - WINDOW
    rows = session.execute(select(R.c.bucket, R.c.window_start, R.c.used).where(
        starts_with(R.c.bucket, PREFIX), R.c.window_start > 0, R.c.window_start <= ended, R.c.used > RECORDED)
        .order_by(R.c.bucket, R.c.window_start).limit(batch)).all()
    written = 0
    for row in rows:
        taken = session.execute(update(R).where(R.c.bucket == row.bucket, R.c.window_start == row.window_start,
                                                R.c.used == row.used).values(used=RECORDED)).rowcount
        if not taken:
            continue
        started = EPOCH + timedelta(seconds=row.window_start)
        client = row.bucket[len(PREFIX):]
        audit.record(session, "redeem", COUNTED, status=404,
                     client=audit.Client(ip=None if client == "-" else client),
                     detail=f"{row.used - RECORDED} more malformed or unsigned tokens in the {WINDOW // 60} min "
                            f"from {started:%Y-%m-%d %H:%M} UTC (the first {RECORDED} are recorded one by one)")
        written += 1
    return written
