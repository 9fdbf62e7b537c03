"""Process memory, read cheaply between handlers (no psutil)."""
from __future__ import annotations

import os
import resource
import weakref

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


_getrusage, _SELF, _write = resource.getrusage, resource.RUSAGE_SELF, os.write  # (the hot path: no module lookups)


def peak_rss_kb() -> int:
    return _getrusage(_SELF).ru_maxrss


_RUSAGE, _HWM, _NONE = "ru_maxrss", "VmHWM", "none"  # how a PeakProbe reads the peak
_PROBES: "weakref.WeakSet" = weakref.WeakSet()  # the probes to reset in a forked child


def _after_fork_in_child() -> None:
    for probe in list(_PROBES):
        probe.forked()


if hasattr(os, "register_at_fork"):
    # Once per interpreter, and it touches only cronbox's own probes: a forked child (the worker
    # pool's, or the host app's) reopens their /proc/self files before its first reading, instead of
    # every reading asking os.getpid() (a system call: ~0.3 us, twice per job).
    os.register_at_fork(after_in_child=_after_fork_in_child)


class RssProbe:
    """rss_kb() for the hot path: /proc/self/statm kept open and read again with pread (about 2 us,
    against 20 us for open + read + close), reopened after a fork (an fd opened through /proc/self
    names the process that opened it, so a pool child must not read its parent's). A fork through
    os.fork (multiprocessing's too) tells the probe (os.register_at_fork); a child forked behind
    Python's back (a C library's fork()) would read its parent's: none of cronbox's does that."""

    def __init__(self):
        self._fd: int | None = None
        self._inherited: int | None = None  # the parent's fd after a fork: closed on the next reading
        _PROBES.add(self)

    def forked(self) -> None:
        if self._fd is not None:  # (a fork before any reading since the last fork keeps the first's)
            self._inherited, self._fd = self._fd, None

    def rss_kb(self) -> int:
        if self._fd is None:
            if self._inherited is not None:  # the parent's, inherited over a fork: this process's copy only
                _close(self._inherited)
                self._inherited = None
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
    alone: getrusage's ru_maxrss, which is max(that mark, the RSS now, the peak the process had
    before its exec). The last is the parent's: a process started by a large one (a test runner)
    starts with its parent's peak, which hides every smaller one; then, and only then, the mark is
    read from /proc/self/status (VmHWM: this program's alone), at ~10 times the cost. Where
    clear_refs cannot be written (not Linux, a hardened /proc), peak_kb() is None and growth is RSS
    after minus before.

    start() also returns the RSS at the reset, which the stretch's growth is measured from: where
    ru_maxrss is this program's, ru_maxrss right after the reset *is* that RSS (the mark was just
    set to it, from the kernel's same page counters as /proc/self/statm's), so one getrusage serves
    instead of a read of statm, at half its cost. Otherwise statm is read, just before the reset.
    "This program's" is judged once, at the first reset: ru_maxrss then at most HIDDEN_MARGIN_KB
    above the RSS (the kernel's per-CPU page counts are folded late, by up to a few hundred KiB, so
    equality cannot be asked for). A pre-exec peak within that margin would, should RSS ever fall
    below it, read as the starting point instead of the RSS, and a call's growth up to that much
    low; the parent cron starts a worker from, /bin/sh, peaks far below any Python's RSS."""

    HIDDEN_MARGIN_KB = 1024  # ru_maxrss above the RSS by more than this right after a reset: not ours

    def __init__(self):
        self._way: str | None = None  # None: not found out yet (or again, in a forked child)
        self._clear: int | None = None
        self._status: int | None = None
        _PROBES.add(self)

    def forked(self) -> None:
        self._way = None  # the fds are the parent's copies: the next start() closes and reopens them

    def _open(self) -> None:
        for fd in (self._clear, self._status):
            if fd is not None:
                _close(fd)
        self._clear = self._status = None
        self._way = _NONE
        try:
            self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
            os.write(self._clear, b"5")
        except OSError:
            return
        self._way = _RUSAGE
        # Right after the reset: ru_maxrss is max(the RSS now, the pre-exec peak); above the RSS,
        # the peak is not this program's and ru_maxrss can tell neither a call's peak nor the RSS.
        if peak_rss_kb() > PROBE.rss_kb() + self.HIDDEN_MARGIN_KB:
            try:
                self._status = os.open("/proc/self/status", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                self._way = _NONE
                return
            self._way = _HWM if self._vm_hwm() is not None else _NONE

    def start(self) -> int:
        """Reset the mark; returns the RSS (KiB) it was reset to."""
        way = self._way
        if way is _RUSAGE:  # the hot path: a write and a getrusage
            try:
                _write(self._clear, b"5")
                return _getrusage(_SELF).ru_maxrss
            except OSError:
                self._way = _NONE
        elif way is None:
            self._open()
            return self.start()
        elif way is _HWM:
            before = PROBE.rss_kb()
            try:
                _write(self._clear, b"5")
            except OSError:
                self._way = _NONE
            return before
        return PROBE.rss_kb()

    def peak_kb(self) -> int | None:
        """The peak since start(); None where it cannot be read (growth is then RSS after minus before)."""
        way = self._way
        if way is _RUSAGE:
            return _getrusage(_SELF).ru_maxrss
        return self._vm_hwm() if way is _HWM else None

    def _vm_hwm(self) -> int | None:
        try:
            data = os.pread(self._status, 4096, 0)
            at = data.index(b"VmHWM:")
            return int(data[at + 6:data.index(b"kB", at)])
        except (OSError, ValueError, TypeError):
            return None


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


PROBE = RssProbe()  # the process's own, for the checks made between handlers (budget, admission)
