"""The limits of one cron-started run, checked between handlers, never by killing one.

A run stops claiming when elapsed + the time headroom + the expected handler time would pass
--max-time, when RSS passes --memory, or when a signal asked it to stop; a stop is for good (the
next run is a fresh process, with the time and memory to take what this one gave back). The
expected time is the mean, over the items this run handled, of their handlers' profiles
(outbox.engine.profiles), each item's own measured time where its handler has none (or admission
is off). Before each item, the runner asks admission (outbox.engine.admission) whether that
item's own profile fits what is left: one rule, per run here and per item there. Batch sizes
shrink as time runs out, so a run never holds leases on work it cannot reach.
"""
from __future__ import annotations

from cronbox.outbox.core import clock
from cronbox.outbox.core.resources import PROBE

DEFAULT_TIME_HEADROOM = 2.0  # seconds kept free at the end of --max-time (CRONBOX_ADMISSION_TIME_HEADROOM)
HEADROOM_SHARE = 0.1  # ... but never more than this share of --max-time (a 3 s run keeps 0.3 s)


class Budget:
    def __init__(self, *, max_time: float | None, memory_mb: float | None, max_handled: int | None = None,
                 time_headroom: float = DEFAULT_TIME_HEADROOM):
        self.started = clock.monotonic()
        self.time_headroom = time_headroom
        self.max_handled = max_handled
        self.max_time = max_time
        self.memory_kb = memory_mb * 1024 if memory_mb else None
        self.handled = 0
        self.handler_seconds = 0.0
        self.signalled: str | None = None
        self.peak_rss_kb = PROBE.rss_kb()
        self.start_rss_kb = self.peak_rss_kb  # what a fresh run of this kind needs before any handler
        self._rss_kb: int | None = None  # the last reading (rss_kb), until the next handler ran

    def elapsed(self) -> float:
        return clock.monotonic() - self.started

    @property
    def headroom(self) -> float:
        """The time kept free at the end of --max-time: the setting, at most HEADROOM_SHARE of it."""
        return min(self.time_headroom, self.max_time * HEADROOM_SHARE) if self.max_time is not None else 0.0

    def remaining(self) -> float:
        if self.max_time is None:
            return float("inf")
        return self.max_time - (clock.monotonic() - self.started)  # (before every item: one call less)

    @property
    def average(self) -> float:
        return self.handler_seconds / self.handled if self.handled else 0.0

    def rss_kb(self) -> int:
        """The worker's RSS between two handlers, read once: stop_reason's memory check reads it before
        each item (but the first of a batch), and admission's check right after takes that reading
        rather than making another (a handler's run is what moves RSS; the bookkeeping between two
        handlers hardly does)."""
        if self._rss_kb is None:
            self._rss_kb = PROBE.rss_kb()
        return self._rss_kb

    def record(self, seconds: float, expected: float | None = None) -> None:
        """A handler ran `seconds`; `expected`: its profile's duration, which the estimate uses instead."""
        self._rss_kb = None  # it moved RSS: read again when a check needs it
        self.handled += 1
        self.handler_seconds += seconds if expected is None else expected

    def stop(self, reason: str) -> None:
        self.signalled = self.signalled or reason

    def stop_reason(self) -> str | None:
        """Why the run must not start another handler, or None."""
        if self.signalled:
            return self.signalled
        if self.max_handled is not None and self.handled >= self.max_handled:
            return "max-jobs"
        if self.max_time is not None:
            elapsed = self.elapsed()
            if elapsed >= self.max_time or (self.handled and elapsed + self.headroom + self.average >= self.max_time):
                return "max-time"
        if self.memory_kb is not None:
            current = self._rss_kb = PROBE.rss_kb()  # before every item: a pread, not an open (rss_kb() shares it)
            self.peak_rss_kb = max(self.peak_rss_kb, current)
            if current >= self.memory_kb:
                # For good: RSS falls back once the items the run gives back unstarted are freed
                # (their payloads), and a run that went on would claim and read them again, and
                # stop again after one item, each time.
                self.stop("memory")
                return "memory"
        return None

    def batch_size(self, largest: int) -> int:
        """How many items to claim now: no more than fit in the time left or the --max-jobs left."""
        if self.max_handled is not None:
            largest = max(1, min(largest, self.max_handled - self.handled))
        if self.max_time is None or self.average <= 0:
            return largest
        fits = int((self.remaining() - self.headroom) / self.average)
        return max(1, min(largest, fits))
