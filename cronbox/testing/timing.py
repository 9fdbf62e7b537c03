"""The clock a test moves: cronbox's one source of "now" (cronbox.outbox.core.clock), frozen while a kit
is active. Everything cronbox stores or compares with a stored time reads it: backoff, delay=,
retry_until, leases, rate-limit windows, periodic task slots. Durations measured on the process's
monotonic clock (a handler's timeout, a run's --max-time) are real time and never move with it."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Callable

from cronbox.outbox.core import clock

from .rows import KitError


class Clock:
    """`now`, `advance(minutes=5)`, `set(datetime(2026, 12, 3, 3, 0))`. advance() only goes forward;
    set() goes anywhere, for a test that starts on a given day (once work has run, leases, slots and
    backoff all assume time does not run back). `moved` is told after each move (inline mode runs what
    became due)."""

    def __init__(self, moved: Callable[[], None] | None = None):
        self._moved = moved

    @property
    def now(self) -> datetime:
        """cronbox's now: naive UTC."""
        return clock.utcnow()

    def advance(self, delta: timedelta | None = None, /, *, days: float = 0, hours: float = 0, minutes: float = 0,
                seconds: float = 0) -> datetime:
        """Move cronbox's clock forward by `delta` and/or the given units; returns the new now."""
        step = (delta or timedelta()) + timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        if step < timedelta():
            raise KitError(f"the clock only moves forward (asked to move {step})")
        self._frozen_or_fail()
        clock.advance(step.total_seconds())
        if self._moved is not None:
            self._moved()
        return clock.utcnow()

    def set(self, at: datetime) -> datetime:
        """Move cronbox's clock to `at` (naive UTC, or aware in any zone)."""
        target = at.astimezone(timezone.utc).replace(tzinfo=None) if at.tzinfo is not None else at
        clock.advance((target - self._frozen_or_fail()).total_seconds())
        if self._moved is not None:
            self._moved()
        return clock.utcnow()

    def _frozen_or_fail(self) -> datetime:
        now = clock.utcnow()
        if not clock.is_frozen():
            raise KitError("the test clock moves only while a cronbox test kit is active "
                           "(the cronbox_kit fixture, or `with Kit(app):`)")
        return now

    def __repr__(self) -> str:
        return f"Clock(now={clock.utcnow().isoformat(sep=' ')})"
