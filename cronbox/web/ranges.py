"""Single byte ranges (RFC 9110 §14): what to send for a Range / If-Range pair.

Decisions, each allowed by the RFC and chosen to be predictable:
- No Range, a unit other than `bytes`, or a malformed header: the whole file
  (200). A server may ignore Range; a malformed one must not become an error.
- More than one range (`bytes=0-1,5-6`): the whole file (200). We do not build
  multipart/byteranges bodies; clients asking for several ranges accept a 200.
- `If-Range` that is not exactly our strong ETag (another ETag, or a date, as we
  send no Last-Modified): the whole file (200), so a client never stitches
  bytes of two different files together.
- A first byte at or past the end, a zero-length suffix, or any range of an
  empty file: 416 with `Content-Range: bytes */<size>`.
- Otherwise 206 for [start, stop), the last byte clamped to the end.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_SPEC = re.compile(r"([0-9]*)-([0-9]*)")  # ASCII digits only (RFC 9110's DIGIT), matched whole
_HUGE = 10 ** 19  # digits beyond int64 mean "past any file we hold"


@dataclass(frozen=True)
class Plan:
    status: int  # 200, 206 or 416
    start: int = 0
    stop: int = 0  # exclusive

    @property
    def length(self) -> int:
        return self.stop - self.start

    def content_range(self, size: int) -> str:
        if self.status == 416:
            return f"bytes */{size}"
        return f"bytes {self.start}-{self.stop - 1}/{size}"


def _number(digits: str) -> int:
    return _HUGE if len(digits) > 18 else int(digits)


def plan(range_header: str | None, if_range: str | None, etag: str, size: int) -> Plan:
    whole = Plan(200, 0, size)
    if range_header is None:
        return whole
    if if_range is not None and if_range.strip() != etag:
        return whole
    unit, _, ranges = range_header.strip().partition("=")
    if unit.strip().lower() != "bytes":
        return whole
    specs = [part.strip() for part in ranges.split(",") if part.strip()]
    if len(specs) != 1:
        return whole
    match = _SPEC.fullmatch(specs[0])
    if not match or match.group(1) == match.group(2) == "":
        return whole
    first, last = match.groups()
    if first == "":  # suffix: the last N bytes
        count = _number(last)
        if count == 0 or size == 0:
            return Plan(416)
        return Plan(206, max(0, size - count), size)
    start = _number(first)
    end = _number(last) if last else None
    if end is not None and end < start:
        return whole  # syntactically invalid: ignored, as a malformed header is
    if start >= size:
        return Plan(416)
    return Plan(206, start, size if end is None else min(end + 1, size))
