"""Parse the human durations the command line takes: 90s, 5m, 48h, 7d, 2w."""
from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds in `text`; a bare number is seconds. Raises ValueError with a usable message."""
    match = _PATTERN.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration (use e.g. 90s, 5m, 48h, 7d, 2w)")
    number, unit = match.groups()
    return float(number) * _UNITS[(unit or "s").lower()]
