"""Parse the human durations settings and options take: 500ms, 90s, 5m, 48h, 7d, 2w.

The one parser for every duration with units (CRONBOX_*_RETENTION, CRONBOX_*_TTL, CRONBOX_METRICS_WINDOW,
CRONBOX_ACK_FLUSH, `--older-than`, `--expires-in`, `--ttl`, `--grace`, ...). A bare number is
refused, never read as seconds: `CRONBOX_AUDIT_RETENTION=2192` meant days, and read as 2,192 seconds
it erased six years of audit trail. Settings and options defined in a unit by their contract (`--max-time S`, `--sleep S`,
CRONBOX_LEASE_MARGIN seconds, CRONBOX_CRON_INTERVAL minutes) are plain numbers and do not come here.
"""
from __future__ import annotations

import re

UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_SECONDS = 100 * 366 * 86400  # a century: more is a typo, and a date that far back overflows datetime
# ASCII digits only (re.ASCII): `\d` would take other scripts' digits too.
_PATTERN = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ms|[smhdw])", re.IGNORECASE | re.ASCII)
_BARE = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)


def parse_duration(text: str, *, example_unit: str = "d") -> float:
    """Seconds in `text` (surrounding whitespace ignored), more than zero and at most a century.
    Raises ValueError with the reason, which callers print after the value ("NAME=2192: a duration
    needs a unit (s, m, h, d), e.g. 2192d"; `example_unit` is the unit that example adds, the one a
    bare number most likely meant: days for a retention, milliseconds for CRONBOX_ACK_FLUSH)."""
    raw = str(text).strip()
    if _BARE.fullmatch(raw):
        raise ValueError(f"a duration needs a unit (s, m, h, d), e.g. {raw}{example_unit}")
    match = _PATTERN.fullmatch(raw)
    if not match:
        raise ValueError("this is not a duration (use e.g. 90s, 5m, 48h, 7d, 2w)")
    number, unit = match.groups()
    seconds = float(number) * UNITS[unit.lower()]
    if seconds <= 0:
        raise ValueError("a duration must be more than zero")
    if seconds > MAX_SECONDS:
        raise ValueError("a duration must be at most 36600d (a century)")
    return seconds
