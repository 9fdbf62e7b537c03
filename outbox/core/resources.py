"""Process memory, read cheaply between handlers (no psutil)."""
from __future__ import annotations

import os
import resource

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def rss_kb() -> int:
    """Current resident set size in KiB (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_KB
    except (OSError, IndexError, ValueError):
        return peak_rss_kb()


def peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
