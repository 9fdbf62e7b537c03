"""Rate limits shared by every worker on every host: fixed-window counters in the database.

`acquire()` runs in its own short transaction before a job starts: one row per
(bucket, window), `UPDATE ... SET used = used + 1 WHERE used < limit`. The row
lock serialises concurrent workers for an instant; the rowcount says whether
this job may go. Over the limit, the job waits via RetryLater until the window
ends, using no attempt.
"""
from __future__ import annotations

import calendar
import ipaddress
import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.core.sql import insert_ignore
from cronbox.outbox.queue.models import RateWindow

R = RateWindow.__table__
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smh])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class RateLimit:
    bucket: str
    limit: int
    per_seconds: int

    @classmethod
    def parse(cls, spec: str, *, bucket: str) -> "RateLimit":
        """"10/s", "100/m", "5/10s", "1000/h"."""
        match = _SPEC.match(spec or "")
        if not match or int(match.group(1)) < 1:
            raise RegistrationError(f"rate limit {spec!r} must look like 10/s, 100/m, 5/10s or 1000/h")
        count, multiple, unit = match.groups()
        return cls(bucket[:64], int(count), int(multiple or 1) * _UNIT[unit])

    def acquire(self, session: Session, now: datetime) -> float | None:
        """Take one slot; None when allowed, else the seconds until the window ends."""
        stamp = calendar.timegm(now.timetuple()) + now.microsecond / 1e6
        window = int(stamp // self.per_seconds) * self.per_seconds
        insert_ignore(session, R, {"bucket": self.bucket, "window_start": window, "used": 0})
        taken = session.execute(
            update(R).where(R.c.bucket == self.bucket, R.c.window_start == window, R.c.used < self.limit)
            .values(used=R.c.used + 1)
        ).rowcount
        if taken == 1:
            return None
        return max(window + self.per_seconds - stamp, 0.05)

    def first_refusal(self, session: Session, now: datetime) -> bool:
        """After acquire() refused: True for the first refusal in this window (the row's count then
        goes one past the limit), so a caller can record a flood of refusals once, not each one."""
        window = self.window_of(now)
        return session.execute(update(R).where(R.c.bucket == self.bucket, R.c.window_start == window,
                                               R.c.used == self.limit).values(used=R.c.used + 1)).rowcount == 1

    def used(self, session: Session, now: datetime) -> int:
        """The slots taken in the window of `now` (0 when none)."""
        return session.scalar(select(R.c.used).where(R.c.bucket == self.bucket,
                                                     R.c.window_start == self.window_of(now))) or 0

    def window_of(self, now: datetime) -> int:
        return int(calendar.timegm(now.timetuple()) // self.per_seconds) * self.per_seconds

    def refund(self, session: Session, window: int) -> None:
        """Give back a slot taken in `window` (window_of() at acquire time): a login that turned out right."""
        session.execute(update(R).where(R.c.bucket == self.bucket, R.c.window_start == window, R.c.used > 0)
                        .values(used=R.c.used - 1))


def client_key(client_ip: str | None) -> str:
    """The part of a per-client bucket name: the IP, IPv6 per /64 (the block one subscriber gets, so
    rotating addresses inside it buys nothing), an IPv4-mapped address as IPv4, "-" when unknown."""
    try:
        address = ipaddress.ip_address(client_ip or "")
    except ValueError:
        return "-"
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def at_most_every(session: Session, bucket: str, seconds: float, now: datetime) -> float | None:
    """A sliding "not more often than every `seconds`" gate: None when allowed (and recorded), else
    the seconds to wait. One row (window_start 0) holds the last start in milliseconds; the
    guarded UPDATE lets exactly one of two simultaneous callers through."""
    stamp = int((calendar.timegm(now.timetuple()) + now.microsecond / 1e6) * 1000)
    gap = int(seconds * 1000)
    insert_ignore(session, R, {"bucket": bucket[:64], "window_start": 0, "used": 0})
    taken = session.execute(update(R).where(R.c.bucket == bucket[:64], R.c.window_start == 0,
                                            R.c.used <= stamp - gap).values(used=stamp)).rowcount
    if taken == 1:
        return None
    last = session.scalar(select(R.c.used).where(R.c.bucket == bucket[:64], R.c.window_start == 0)) or 0
    return max((last + gap - stamp) / 1000, 0.05)


def prune(session: Session, before: datetime) -> int:
    """Old fixed windows (the sliding gates' rows, window_start 0, stay)."""
    cutoff = calendar.timegm(before.timetuple())
    return session.execute(delete(R).where(R.c.window_start < cutoff, R.c.window_start > 0)).rowcount
