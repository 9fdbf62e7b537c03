"""The one source of "now" for everything that is stored or compared with stored times.

Times are naive UTC datetimes with microseconds, the same on SQLite and MySQL
(whose sessions are set to time_zone '+00:00'). Tests freeze or move time with
`frozen()`; nothing else in cronbox calls datetime.now().
"""
from __future__ import annotations

import contextlib
import time as _time
from datetime import datetime, timedelta, timezone

_frozen: datetime | None = None


def utcnow() -> datetime:
    if _frozen is not None:
        return _frozen
    return datetime.now(timezone.utc).replace(tzinfo=None)


def unix() -> float:
    """utcnow() as Unix seconds (frozen with it), without building a datetime when not frozen."""
    if _frozen is not None:
        return (_frozen - datetime(1970, 1, 1)).total_seconds()
    return _time.time()


def monotonic() -> float:
    return _time.monotonic()


@contextlib.contextmanager
def frozen(at: datetime):
    """Freeze `utcnow()` at `at` (naive UTC); `advance()` moves it."""
    global _frozen
    previous = _frozen
    _frozen = at.replace(tzinfo=None) if at.tzinfo is None else at.astimezone(timezone.utc).replace(tzinfo=None)
    try:
        yield
    finally:
        _frozen = previous


def is_frozen() -> bool:
    """Is utcnow() frozen (inside frozen())? cronbox.testing's clock moves only then."""
    return _frozen is not None


def advance(seconds: float) -> None:
    global _frozen
    if _frozen is None:
        raise RuntimeError("advance() only works inside clock.frozen()")
    _frozen = _frozen + timedelta(seconds=seconds)
