"""Admission: start a handler only when the run's remaining time and memory fit its profile.

Before each claimed job or delivery, its handler's profile (outbox.engine.profiles: mean duration,
largest RSS growth over the recent window) is compared with what the run has left:
- time: --max-time minus the time already used minus CRONBOX_ADMISSION_TIME_HEADROOM, at most a
  tenth of --max-time (the ack, the heartbeat row and the exit still need time; a 3 s run keeps 0.3 s);
- memory: --memory minus the worker's RSS now minus CRONBOX_ADMISSION_MEMORY_HEADROOM, and the
  process's real limit where the kernel shows one (cgroup memory.max, an LVE's lMEMPHY:
  outbox.core.memlimit) minus its use and the same headroom. Passing --memory only stops the run;
  passing the kernel's limit is a SIGKILL (CloudLinux kills the account's process), so both count.
A handler with no fresh profile is admitted (and measured). The RSS compared with includes the
payloads of the items claimed and not yet started, which a claim bounds (outbox.engine.claim's
CLAIM_BYTES): a batch of large payloads does not look like a run out of memory before it starts.

Not fitting now ("later"): the item is given back (released, no attempt used) and the run stops,
as it would have at its limit: time only runs out, and a Python process's RSS rarely shrinks, so
the next run (a fresh process, a new --max-time) is the one that fits it. The items claimed after
it are released the same way.

Never fitting ("never"): the profile needs more than this kind of run can ever give, even fresh:
longer than --max-time minus the headroom, or more memory than --memory / the kernel's limit minus
the headroom and the RSS the run started with (the interpreter and its imports: ~50 MB for a worker;
without it, a handler a fresh run cannot fit either would be "later" for ever, stopping every run
that reaches it). The handler is marked never-fits with that reason (the profile row, a warning per
item, `queue status` / `outbox status`, the console's Queues page), and the item waits NEVER_FITS_DELAY
without using an attempt, so it neither blocks the queue nor starves silently. It still runs where
a run has room: a run without that limit (e.g. `queue work` without --max-time) admits it and clears
the mark; and a profile older than CRONBOX_PROFILE_TTL counts as unknown, so a bounded run tries it
once more and measures it again.

CRONBOX_ADMISSION=off turns all of it off (no checks, no measuring); the run then stops on its own
average handler time, as before.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.memlimit import DEFAULT_LVE_LIST, DEFAULT_ROOT, process_limit
from cronbox.outbox.core.resources import PROBE, PeakProbe
from cronbox.outbox.engine.budget import DEFAULT_TIME_HEADROOM
from cronbox.outbox.engine.profiles import Book, ProfileSettings

log = logging.getLogger("cronbox")

DEFAULT_MEMORY_HEADROOM_MB = 8.0
NEVER_FITS_DELAY = 300.0  # seconds a never-fitting item waits (no attempt used) before a run looks again
KERNEL_SECONDS = 1.0  # the kernel's limit and use are read again at most this often
RELOAD_SECONDS = 60.0  # a long-lived worker reads the other runs' profiles again this often


def time_headroom(settings) -> float:
    """CRONBOX_ADMISSION_TIME_HEADROOM: seconds kept free at the end of --max-time (1 s-1 h)."""
    return settings.duration("CRONBOX_ADMISSION_TIME_HEADROOM", DEFAULT_TIME_HEADROOM, bounds=(1, 3600),
                             why="1 second and 1 hour")


@dataclass(frozen=True)
class AdmissionSettings:
    enabled: bool
    time_headroom: float  # seconds
    memory_headroom_kb: int
    profiles: ProfileSettings
    cgroup_root: str
    lve_list: str

    @classmethod
    def of(cls, settings) -> "AdmissionSettings":
        switch = (settings.get("CRONBOX_ADMISSION") or "on").lower()
        if switch not in ("on", "off"):
            raise SettingsError(f"CRONBOX_ADMISSION={switch!r} must be on or off")
        memory = settings.number("CRONBOX_ADMISSION_MEMORY_HEADROOM", DEFAULT_MEMORY_HEADROOM_MB, float, minimum=0)
        return cls(enabled=switch == "on", time_headroom=time_headroom(settings),
                   memory_headroom_kb=int(memory * 1024), profiles=ProfileSettings.of(settings),
                   cgroup_root=settings.get("CRONBOX_CGROUP_ROOT") or DEFAULT_ROOT,
                   lve_list=settings.get("CRONBOX_LVE_LIST") or DEFAULT_LVE_LIST)


@dataclass(frozen=True)
class Verdict:
    later: bool  # True: a later run fits it (release, stop this run); False: never fits runs like this
    stop: str  # the run's stop reason: "max-time" / "memory"
    reason: str


class Admission:
    """One runner's admission (its kind's profiles): check() before a handler, probe() and
    record() around it, flush() at the end of each batch and run."""

    def __init__(self, kind: str, settings):
        self.kind = kind
        self.settings = AdmissionSettings.of(settings)
        self.enabled = self.settings.enabled
        self.book = Book(kind, self.settings.profiles)
        self._peak = PeakProbe()
        self._kernel = None  # (limit kb, use kb, source, our RSS kb then), None: no limit known
        self._kernel_due = 0.0  # when the kernel's limit is read again (monotonic)
        self._loaded_at = 0.0

    # -- the run's edges -----------------------------------------------------------------
    def start(self, sessions) -> None:
        """Before a run's first item (the runner's first batch): the profiles as the database has them
        (one SELECT), read again once a minute, after writing what this process learnt since (a batch of
        a long run may come first: the read must include its samples)."""
        if self.enabled and (not self.book.loaded or clock.monotonic() - self._loaded_at >= RELOAD_SECONDS):
            if self.book.loaded:
                self.book.flush(sessions)
            self.book.load(sessions)
            self._loaded_at = clock.monotonic()

    def flush(self, sessions, *, force: bool = False) -> None:
        if self.enabled and (force or self.book.due()):
            self.book.flush(sessions)

    # -- around one handler ----------------------------------------------------------------
    def probe(self) -> int | None:
        """Before a handler: the kernel's peak mark reset to the RSS now, and that RSS (PeakProbe.start)."""
        return self._peak.start() if self.enabled else None

    def record(self, handler: str, probe: int | None, seconds: float) -> float | None:
        """Add the run to the handler's profile; returns the profile's duration (the budget's estimate).

        Growth: the peak RSS during the call minus RSS before it: what the handler needed at its
        worst. RSS after minus before would miss a handler that frees what it allocated (large blocks
        go back to the kernel at once); ru_maxrss without the reset says nothing once an earlier,
        bigger handler (or the parent before exec) set the process's peak higher. Where the peak
        cannot be read, RSS after minus before."""
        if probe is None:
            return None
        peak = self._peak.peak_kb()  # at least the RSS now: the mark is never below it
        growth = (peak if peak is not None else PROBE.rss_kb()) - probe
        return self.book.add(handler, seconds, growth).duration

    # -- the check -------------------------------------------------------------------------
    def check(self, handler: str, budget) -> Verdict | None:
        """None: start it. A Verdict: do not (see the module's docstring for what then)."""
        if not self.enabled:
            return None
        profile = self.book.get(handler)
        if profile is None:
            return None
        verdict = self._time(profile.duration, budget) or (
            self._memory(profile.growth_kb, budget) if profile.growth_kb > 0 else None)
        if verdict is None:
            if profile.never_fits is not None and (budget.max_time is not None or budget.memory_kb is not None
                                                   or self._kernel_limit(budget) is not None):
                self.book.never_fits(handler, None)  # a bounded run took it: whatever a run said before is past
            return None
        if not verdict.later:
            self.book.never_fits(handler, verdict.reason)
        return verdict

    def _time(self, needs: float, budget) -> Verdict | None:
        if budget.max_time is None or needs <= 0:
            return None
        headroom = budget.headroom
        if needs > budget.max_time - headroom:
            return Verdict(False, "max-time", f"runs {needs:.1f}s on average, longer than --max-time "
                                              f"{budget.max_time:g}s minus {headroom:g}s headroom")
        left = budget.remaining() - headroom
        if needs > left:
            return Verdict(True, "max-time", f"runs {needs:.1f}s on average; {max(left, 0):.1f}s of --max-time "
                                             f"left after the {headroom:g}s headroom")
        return None

    def _memory(self, needs_kb: int, budget) -> Verdict | None:
        if needs_kb <= 0:
            return None
        headroom = self.settings.memory_headroom_kb
        base = budget.start_rss_kb  # a fresh run's own RSS: what no run of this kind is without
        if budget.memory_kb is not None:
            if needs_kb > budget.memory_kb - headroom - base:
                return Verdict(False, "memory", f"grows RSS by {_mb(needs_kb)}, more than --memory "
                                                f"{_mb(budget.memory_kb)} minus {_mb(headroom)} headroom and the "
                                                f"run's own {_mb(base)}")
            left = budget.memory_kb - budget.rss_kb() - headroom
            if needs_kb > left:
                return Verdict(True, "memory", f"grows RSS by {_mb(needs_kb)}; {_mb(max(left, 0))} of --memory "
                                               f"{_mb(budget.memory_kb)} left after the {_mb(headroom)} headroom")
        kernel = self._kernel_limit(budget)
        if kernel is not None:
            limit_kb, used_kb, source = kernel
            if needs_kb > limit_kb - headroom - base:
                return Verdict(False, "memory", f"grows RSS by {_mb(needs_kb)}, more than the {source} limit "
                                                f"{_mb(limit_kb)} minus {_mb(headroom)} headroom and the run's own "
                                                f"{_mb(base)}")
            left = limit_kb - used_kb - headroom
            if needs_kb > left:
                return Verdict(True, "memory", f"grows RSS by {_mb(needs_kb)}; {_mb(max(left, 0))} left under "
                                               f"the {source} limit after the {_mb(headroom)} headroom")
        return None

    def _kernel_limit(self, budget) -> tuple[int, int, str] | None:
        """(limit, in use, where) in KiB, read at most every KERNEL_SECONDS; between reads the use is
        moved by this process's own RSS change (the other processes of the group are what they were).
        The RSS is the budget's reading between two handlers (Budget.rss_kb), shared with its own
        memory check and with --memory's above: one reading per item."""
        now = clock.monotonic()
        if now >= self._kernel_due:
            found = process_limit(self.settings.cgroup_root, self.settings.lve_list)
            self._kernel = None if found is None else (found.limit // 1024, found.used // 1024, found.source,
                                                       budget.rss_kb())
            self._kernel_due = now + KERNEL_SECONDS
        if self._kernel is None:
            return None
        limit_kb, used_kb, source, rss_then = self._kernel
        return limit_kb, used_kb + (budget.rss_kb() - rss_then), source

def _mb(kb: float) -> str:
    return f"{kb / 1024:.0f} MB"
