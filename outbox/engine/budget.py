"""The limits of one cron-started run, checked between handlers, never by killing one.

A run stops claiming when elapsed + 3 x the average handler time would pass
--max-time (so the last handler it starts is expected to finish in time), when
RSS passes --memory, or when a signal asked it to stop. Batch sizes shrink as
time runs out, so it never holds leases on work it cannot reach.
"""
from __future__ import annotations

from outbox.core import clock
from outbox.core.resources import rss_kb

SAFETY = 3  # multiples of the average handler time kept in reserve


class Budget:
    def __init__(self, *, max_time: float | None, memory_mb: float | None, max_handled: int | None = None):
        self.started = clock.monotonic()
        self.max_handled = max_handled
        self.max_time = max_time
        self.memory_kb = memory_mb * 1024 if memory_mb else None
        self.handled = 0
        self.handler_seconds = 0.0
        self.signalled: str | None = None
        self.peak_rss_kb = rss_kb()

    def elapsed(self) -> float:
        return clock.monotonic() - self.started

    def remaining(self) -> float:
        if self.max_time is None:
            return float("inf")
        return self.max_time - self.elapsed()

    @property
    def average(self) -> float:
        return self.handler_seconds / self.handled if self.handled else 0.0

    def record(self, seconds: float) -> None:
        self.handled += 1
        self.handler_seconds += seconds

    def stop(self, reason: str) -> None:
        self.signalled = self.signalled or reason

    def stop_reason(self) -> str | None:
        """Why the run must not start another handler, or None."""
        if self.signalled:
            return self.signalled
        if self.max_handled is not None and self.handled >= self.max_handled:
            return "max-jobs"
        if self.max_time is not None and self.elapsed() + SAFETY * self.average >= self.max_time:
            return "max-time"
        if self.memory_kb is not None:
            current = rss_kb()
            self.peak_rss_kb = max(self.peak_rss_kb, current)
            if current >= self.memory_kb:
                return "memory"
        return None

    def batch_size(self, largest: int) -> int:
        """How many items to claim now: no more than fit in the time left or the --max-jobs left."""
        if self.max_handled is not None:
            largest = max(1, min(largest, self.max_handled - self.handled))
        if self.max_time is None or self.average <= 0:
            return largest
        fits = int((self.remaining() - SAFETY * self.average) / self.average)
        return max(1, min(largest, fits))
