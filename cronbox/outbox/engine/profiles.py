"""Handler profiles: how long each handler runs and how much the worker's RSS grows while it does,
over its recent runs, kept in cronbox_handler_profiles for admission (outbox.engine.admission).

A profile is made of samples (when, ms, KiB of growth), at most CRONBOX_PROFILE_WINDOW of them,
none older than CRONBOX_PROFILE_TTL: a handler that changed is judged by what it does now, and a
handler that has not run for a while (its profile stale) is run again as if unknown, which is how
a "never fits" verdict gets measured again. The summary the runs use: the mean duration (an overrun
only finishes a run late: nothing is killed for time) and the largest growth (a memory overrun is a
SIGKILL of the whole account's process on CloudLinux, so the worst recent run counts).

Writes stay off the hot path: samples are kept in memory (`Book`) and upserted at most every
FLUSH_SECONDS and at the end of each run, one transaction for all the handlers that ran, never a
round trip per item. A worker killed before it flushed loses its last samples; they are estimates.
Two runs flushing one handler at once merge under the row lock (SELECT ... FOR UPDATE at READ
COMMITTED; SQLite's BEGIN IMMEDIATE serializes writers anyway); the same new row inserted by both
fails one of them on the primary key, which then merges into the other's row (one retry).
"""
from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.models import HandlerProfile

log = logging.getLogger("cronbox")

DEFAULT_WINDOW = 20  # samples kept per handler
DEFAULT_TTL = 7 * 86400.0  # seconds a sample counts for
FLUSH_SECONDS = 5.0  # samples are written at most this often (and at the end of each run)


@dataclass(frozen=True)
class ProfileSettings:
    window: int = DEFAULT_WINDOW
    ttl: float = DEFAULT_TTL

    @classmethod
    def of(cls, settings) -> "ProfileSettings":
        """CRONBOX_PROFILE_WINDOW (samples, 1-1000) and CRONBOX_PROFILE_TTL (a duration, 1 min-90 d)."""
        window = settings.number("CRONBOX_PROFILE_WINDOW", DEFAULT_WINDOW, int, minimum=1)
        if window > 1000:
            raise SettingsError(f"CRONBOX_PROFILE_WINDOW={window} must be at most 1000 (samples per handler)")
        ttl = settings.duration("CRONBOX_PROFILE_TTL", DEFAULT_TTL, bounds=(60, 90 * 86400),
                                why="1 minute and 90 days")
        return cls(window=window, ttl=ttl)


@dataclass
class Profile:
    """One handler's recent runs; `duration` in seconds (mean), `growth_kb` the largest: kept up to
    date by summarize() after each change (admission reads them before every item)."""

    samples: list = field(default_factory=list)  # [[unix seconds, ms, kb], ...], oldest first
    runs: int = 0  # runs ever recorded (the window keeps only the last ones)
    never_fits: str | None = None
    never_fits_at: datetime | None = None
    duration: float = 0.0
    growth_kb: int = 0
    _total_ms: int = 0

    def summarize(self) -> None:
        samples = self.samples
        self._total_ms = sum(s[1] for s in samples)
        self.duration = self._total_ms / len(samples) / 1000 if samples else 0.0
        self.growth_kb = max((s[2] for s in samples), default=0)

    def add(self, sample: list, window: int) -> None:
        """One more run, the oldest past the window dropped: the summary moved, not recomputed (after
        every job or delivery: kept to plain comparisons)."""
        samples = self.samples
        samples.append(sample)
        self.runs += 1
        kb = sample[2]
        total = self._total_ms + sample[1]
        if kb > self.growth_kb:
            self.growth_kb = kb
        if len(samples) > window:
            dropped = samples.pop(0)
            total -= dropped[1]
            if dropped[2] == self.growth_kb and kb < dropped[2]:  # the largest left the window
                self.growth_kb = max(s[2] for s in samples)
        self._total_ms = total
        self.duration = total / len(samples) / 1000

    def trim(self, now: float, settings: ProfileSettings) -> None:
        self.samples = [s for s in self.samples if s[0] > now - settings.ttl][-settings.window:]
        self.summarize()


@dataclass
class Unwritten:
    """What a run learnt of one handler since its last flush: how many runs, and the last of their
    samples, as many as the window keeps (the merge keeps the newest `window` of the row's and these
    together, so an older one of these could never be written: a 5,000-job run holds 20, not 5,000)."""

    samples: deque
    runs: int = 0


EPOCH = datetime(1970, 1, 1)


def epoch(moment: datetime) -> float:
    """A naive UTC datetime as Unix seconds (datetime.timestamp() would take it for local time)."""
    return (moment - EPOCH).total_seconds()


def _load_samples(text: str | None) -> list:
    try:
        samples = json.loads(text or "[]")
    except ValueError:
        return []
    return [s for s in samples if isinstance(s, list) and len(s) == 3] if isinstance(samples, list) else []


def _fresh(row: HandlerProfile, now: float, settings: ProfileSettings) -> Profile:
    profile = Profile(samples=_load_samples(row.samples), runs=row.runs, never_fits=row.never_fits,
                      never_fits_at=row.never_fits_at)
    profile.trim(now, settings)
    return profile


class Book:
    """The profiles of one kind ("job" / "delivery") as a run knows them: loaded once when the run
    starts (one SELECT), updated in memory by every handler run, written by flush()."""

    def __init__(self, kind: str, settings: ProfileSettings):
        self.kind = kind
        self.settings = settings
        self.known: dict[str, Profile] = {}
        self.pending: dict[str, Unwritten] = {}  # handler -> runs not yet written
        self.verdicts: dict[str, str | None] = {}  # handler -> never-fits reason (None: it fits) to write
        self.loaded = False
        self.flushed_at = clock.monotonic()

    def load(self, sessions) -> None:
        now = clock.utcnow()
        rows = in_transaction(sessions, lambda s: list(s.scalars(
            select(HandlerProfile).where(HandlerProfile.kind == self.kind))))
        self.known = {row.handler: _fresh(row, epoch(now), self.settings) for row in rows}
        self.loaded = True

    def get(self, handler: str) -> Profile | None:
        """The handler's profile, None when it has no fresh sample (unknown: admitted, and measured)."""
        profile = self.known.get(handler)
        return profile if profile is not None and profile.samples else None

    def add(self, handler: str, seconds: float, growth_kb: int) -> Profile:
        """One run of the handler (after every job or delivery: kept cheap). Its time is rounded to the
        millisecond, as stored, only when written (_merge): round(t, 3) costs more than the rest of this."""
        sample = [clock.unix(), round(seconds * 1000), int(growth_kb) if growth_kb > 0 else 0]
        window = self.settings.window
        profile = self.known.get(handler)
        if profile is None:
            profile = self.known[handler] = Profile()
        profile.add(sample, window)
        unwritten = self.pending.get(handler)
        if unwritten is None:
            unwritten = self.pending[handler] = Unwritten(deque(maxlen=window))
        unwritten.samples.append(sample)
        unwritten.runs += 1
        return profile

    def never_fits(self, handler: str, reason: str | None) -> None:
        """Record (or, with None, clear) why no run like this one can admit the handler; written by flush()."""
        profile = self.known.get(handler)
        known = profile.never_fits if profile is not None else None
        if known == reason:
            return  # nothing new (and a handler without a profile gets no row for "it fits")
        if profile is not None:
            profile.never_fits, profile.never_fits_at = reason, clock.utcnow() if reason else None
        self.verdicts[handler] = reason

    def due(self) -> bool:
        return bool(self.pending or self.verdicts) and clock.monotonic() - self.flushed_at >= FLUSH_SECONDS

    def flush(self, sessions) -> None:
        """Merge what this run learnt into the rows, in one transaction (one retry on a racing INSERT)."""
        if not (self.pending or self.verdicts):
            return
        pending, verdicts = self.pending, self.verdicts
        for attempt in (1, 2):
            try:
                in_transaction(sessions, lambda s: self._merge(s, pending, verdicts), retry_waits=False)
                break
            except IntegrityError:
                if attempt == 2:
                    raise
        self.pending, self.verdicts = {}, {}
        self.flushed_at = clock.monotonic()

    def _merge(self, session, pending: dict, verdicts: dict) -> None:
        names = sorted(set(pending) | set(verdicts))
        now = clock.utcnow()
        # FOR UPDATE: a racing run's merge of the same handler waits for ours, then reads our samples.
        rows = {row.handler: row for row in session.scalars(
            select(HandlerProfile).where(HandlerProfile.kind == self.kind, HandlerProfile.handler.in_(names))
            .with_for_update())}
        for name in names:
            row = rows.get(name)
            profile = _fresh(row, epoch(now), self.settings) if row is not None else Profile()
            unwritten = pending.get(name)
            if unwritten is not None:
                profile.samples = sorted(profile.samples + [[round(s[0], 3), s[1], s[2]] for s in unwritten.samples])
                profile.runs += unwritten.runs
            profile.trim(epoch(now), self.settings)
            if name in verdicts:
                reason = verdicts[name]
                if reason != profile.never_fits:
                    profile.never_fits, profile.never_fits_at = reason, now if reason else None
            values = dict(runs=profile.runs, duration_ms=round(profile.duration * 1000), rss_growth_kb=profile.growth_kb,
                          samples=json.dumps(profile.samples), updated_at=now,
                          never_fits=profile.never_fits[:255] if profile.never_fits else None,
                          never_fits_at=profile.never_fits_at)
            if row is None:
                session.add(HandlerProfile(kind=self.kind, handler=name[:NAME_MAX], **values))
            else:
                for key, value in values.items():
                    setattr(row, key, value)
        session.flush()


# -- the read model the CLI and the console share ---------------------------------------
@dataclass(frozen=True)
class ProfileView:
    kind: str
    handler: str
    runs: int
    samples: int  # fresh samples in the window
    duration_ms: int
    rss_growth_kb: int
    updated_at: datetime
    stale: bool  # no sample younger than the TTL: runs treat the handler as unknown
    never_fits: str | None
    never_fits_at: datetime | None


def overview(session, settings: ProfileSettings, now: datetime) -> list[ProfileView]:
    """Every profile, by kind and handler (one small table: a row per handler)."""
    out = []
    for row in session.scalars(select(HandlerProfile).order_by(HandlerProfile.kind, HandlerProfile.handler)):
        profile = _fresh(row, epoch(now), settings)
        out.append(ProfileView(row.kind, row.handler, row.runs, len(profile.samples),
                               round(profile.duration * 1000) if profile.samples else row.duration_ms,
                               profile.growth_kb if profile.samples else row.rss_growth_kb, row.updated_at,
                               not profile.samples, row.never_fits, row.never_fits_at))
    return out


def never_fitting(session, kind: str | None = None) -> list[HandlerProfile]:
    """The handlers some run found it can never admit (reported by `queue status` / `outbox status`)."""
    query = select(HandlerProfile).where(HandlerProfile.never_fits.is_not(None))
    if kind is not None:
        query = query.where(HandlerProfile.kind == kind)
    return list(session.scalars(query.order_by(HandlerProfile.kind, HandlerProfile.handler)))
