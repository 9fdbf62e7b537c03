"""The overview's 24-hour chart: per minute, work handled and backlog, from the tick heartbeat rows.

Each run (tick, worker, publish) writes a heartbeat row with its counts; the
chart sums `delivered + jobs_done` into the minute the run started, takes the
largest backlog a tick saw in each minute, and marks minutes in which no tick
started (cron stopped, or the host skipped us). It is drawn as inline SVG,
one x unit per minute, with no script and no external file: the page works
under a strict Content-Security-Policy and on a phone.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from cronbox.outbox.engine import heartbeat

MINUTES = 24 * 60
HEIGHT = 100  # SVG units of each panel
FAILED_OUTCOMES = ("error", "lock-lost", "lost-connection")


@dataclass
class Series:
    start: datetime  # the first minute shown (UTC)
    handled: list[int]
    backlog: list[int | None]
    ticks: list[int]
    errors: list[int]

    def missed(self, interval: int = 1) -> list[bool]:
        """Per minute: no tick started in it nor in the `interval` - 1 minutes before (with cron every
        5 minutes, four quiet minutes in five are expected, not missed)."""
        out, last_tick = [], None
        for minute, count in enumerate(self.ticks):
            if count:
                last_tick = minute
            out.append(last_tick is None and minute >= interval - 1 or
                       last_tick is not None and minute - last_tick >= interval)
        return out


def floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def series(session: Session, now: datetime) -> Series:
    """The last 24 hours up to and including the current minute."""
    start = floor_minute(now) - timedelta(minutes=MINUTES - 1)
    end = start + timedelta(minutes=MINUTES)
    handled, ticks, errors = [0] * MINUTES, [0] * MINUTES, [0] * MINUTES
    backlog: list[int | None] = [None] * MINUTES
    for started_at, command, delivered, jobs_done, seen_backlog, outcome in heartbeat.between(session, start, end):
        minute = int((started_at - start).total_seconds() // 60)
        handled[minute] += (delivered or 0) + (jobs_done or 0)
        if outcome in FAILED_OUTCOMES:
            errors[minute] += 1
        if command == "tick":
            ticks[minute] += 1
            if seen_backlog is not None:
                backlog[minute] = max(backlog[minute] or 0, seen_backlog)
    return Series(start, handled, backlog, ticks, errors)


def nice_ceiling(value: int) -> int:
    """The axis maximum: 1, 2 or 5 times a power of ten, at least `value` (and at least 1)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


@dataclass(frozen=True)
class Drawing:
    handled_max: int
    backlog_max: int
    handled_path: str  # one vertical bar per minute with work
    backlog_path: str  # a line, broken where no tick reported a backlog
    gap_path: str  # a short mark under each minute without a tick
    error_path: str  # a mark above each minute with a failed run
    hour_marks: list[tuple[int, str]]  # (x, "HH:00") every three hours
    summary: str  # the chart in words, for screen readers and for anyone


def _y(value: int, maximum: int) -> int:
    """Height in SVG units; any work at all gets at least one unit, so a quiet minute is not lost."""
    return HEIGHT - max(round(value * HEIGHT / maximum), 1 if value > 0 else 0)


def draw(data: Series, interval: int = 1) -> Drawing:
    """`interval`: minutes between cron runs (CRONBOX_CRON_INTERVAL)."""
    handled_max = nice_ceiling(max(data.handled))
    backlog_max = nice_ceiling(max((b for b in data.backlog if b is not None), default=0))
    bars = [f"M{x} {HEIGHT}V{_y(v, handled_max)}" for x, v in enumerate(data.handled) if v > 0]
    line, pen_down = [], False
    for x, value in enumerate(data.backlog):
        if value is None:
            pen_down = False
            continue
        line.append(f"{'L' if pen_down else 'M'}{x} {_y(value, backlog_max)}")
        pen_down = True
    missed = data.missed(interval)
    gaps = [f"M{x} {HEIGHT + 2}V{HEIGHT + 6}" for x, gap in enumerate(missed) if gap]
    errors = [f"M{x} 0V4" for x, e in enumerate(data.errors) if e > 0]
    marks = []
    for x in range(MINUTES):
        moment = data.start + timedelta(minutes=x)
        if moment.minute == 0 and moment.hour % 3 == 0:
            marks.append((x, f"{moment:%H}:00"))
    return Drawing(handled_max, backlog_max, " ".join(bars), " ".join(line), " ".join(gaps), " ".join(errors),
                   marks, _summary(data, sum(missed), interval))


def _summary(data: Series, missed: int, interval: int) -> str:
    total = sum(data.handled)
    parts = [f"Last 24 hours: {total:,} items handled"]
    if total:
        peak = max(range(MINUTES), key=lambda i: data.handled[i])
        parts.append(f"peak {data.handled[peak]:,} per minute at "
                     f"{data.start + timedelta(minutes=peak):%H:%M} UTC")
    seen = [(i, b) for i, b in enumerate(data.backlog) if b is not None]
    if seen:
        peak_i, peak_b = max(seen, key=lambda item: item[1])
        parts.append(f"backlog {seen[-1][1]:,} at the last tick, peak {peak_b:,} at "
                     f"{data.start + timedelta(minutes=peak_i):%H:%M} UTC")
    parts.append(f"{missed:,} of {MINUTES:,} minutes without a tick"
                 + (f" in the {interval} minutes before" if interval > 1 else ""))
    failed = sum(data.errors)
    if failed:
        parts.append(f"{failed:,} failed runs")
    return "; ".join(parts) + "."
