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


class RssProbe:
    """rss_kb() for the hot path: /proc/self/statm kept open and read again with pread (about 2 us,
    against 20 us for open + read + close), reopened after a fork (an fd opened through /proc/self
    names the process that opened it, so a pool child must not read its parent's)."""

    def __init__(self):
        self._fd: int | None = None
        self._pid = 0

    def rss_kb(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            if self._fd is not None:  # the parent's, inherited over a fork: this process's copy only
                try:
                    os.close(self._fd)
                except OSError:
                    pass
            self._fd, self._pid = None, pid
            try:
                self._fd = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return rss_kb()
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) * _PAGE_KB
        except (OSError, IndexError, ValueError):
            return rss_kb()


class PeakProbe:
    """The peak RSS of one stretch of code (a handler's call), in KiB.

    start() resets the kernel's high-water mark of this process's memory to its RSS now (writing
    "5" to /proc/self/clear_refs, Linux 4.0+), so peak_kb() afterwards is the peak of that stretch
    alone: getrusage's ru_maxrss, which is max(that mark, the peak the process had before its
    exec). The latter is the parent's: a process started by a large one (a test runner) starts with
    its parent's peak, which hides every smaller one; then, and only then, the mark is read from
    /proc/self/status (VmHWM: this program's alone), at ~10 times the cost. Where clear_refs cannot be
    written (not Linux, a hardened /proc), peak_kb() is None and growth is RSS after minus before."""

    def __init__(self):
        self._pid = 0
        self._clear: int | None = None
        self._status: int | None = None
        self._hidden = False  # ru_maxrss is the pre-exec peak: read VmHWM instead

    def _open(self) -> None:
        for fd in (self._clear, self._status):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._pid, self._clear, self._status, self._hidden = os.getpid(), None, None, False
        try:
            self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
            os.write(self._clear, b"5")
        except OSError:
            self._clear = None
            return
        if peak_rss_kb() > PROBE.rss_kb() + 1024:  # right after the reset: the peak is not this program's
            try:
                self._status = os.open("/proc/self/status", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                self._hidden = self._vm_hwm() is not None
            except OSError:
                self._status = None

    def start(self) -> None:
        if self._pid != os.getpid():
            self._open()
        if self._clear is not None:
            try:
                os.write(self._clear, b"5")
            except OSError:
                self._clear = None

    def peak_kb(self) -> int | None:
        if self._clear is None:
            return None
        return self._vm_hwm() if self._hidden else peak_rss_kb()

    def _vm_hwm(self) -> int | None:
        try:
            data = os.pread(self._status, 4096, 0)
            at = data.index(b"VmHWM:")
            return int(data[at + 6:data.index(b"kB", at)])
        except (OSError, ValueError, TypeError):
            return None


PROBE = RssProbe()  # the process's own, for the checks made between handlers (budget, admission)
