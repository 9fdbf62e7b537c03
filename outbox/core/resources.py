"""Process memory, read cheaply between handlers (no psutil)."""
from __future__ import annotations

import os
import resource

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def rss_kb() -> int:
    """Current resident set size in KiB (Linux /proc; peak RSS elsewhere)."""
    current = rss_kb_of("self")
    return peak_rss_kb() if current is None else current


def rss_kb_of(pid: int | str) -> int | None:
    """Resident set size of process `pid` in KiB from /proc/<pid>/statm; None where /proc has no such
    process (it exited, or this is not Linux). Pages shared with another process count in each."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_KB
    except (OSError, IndexError, ValueError):
        return None


def peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
