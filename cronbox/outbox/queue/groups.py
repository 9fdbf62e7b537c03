"""Concurrency groups and cost budgets: limits on jobs shared by every worker on every host.

A concurrency group ("providers", limit 3) lets at most `limit` of its jobs run at once, whichever
worker, process or host runs them. Its slots are rows of cronbox_group_slots (slot 0 .. limit-1),
each free or held by one job's attempt with a lease: the worker takes one just before the handler
starts (outbox.queue.worker's pre-call gate), and frees it in the transaction that acks, retries or
fails the job. A holder killed mid-job (SIGKILL, the host's memory killer) never frees its slot; its
lease, the job's own (timeout + CRONBOX_LEASE_MARGIN), runs out and the slot is free again.

A cost budget ("100/m" for queue sms, or for group providers) caps the summed `cost` of the jobs
started per fixed window, counted in cronbox_rate_windows like the rate limits (outbox.queue.ratelimit):
`used = used + cost WHERE used + cost <= limit`. Budgets are settings:
CRONBOX_QUEUE_BUDGETS="sms=100/m,mail=2000/h" and CRONBOX_GROUP_BUDGETS="providers=500/h".

A job refused by either (group full, budget spent) waits via RetryLater: no attempt used, and the
worker goes on with the rest of its batch; a group-full job is tried again after
min(the soonest holder's lease, CRONBOX_GROUP_WAIT), a budget-refused one when the window ends.
"""
from __future__ import annotations

import calendar
import functools
import hashlib
import os
import re
import socket
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from cronbox.outbox.core.errors import RegistrationError, SettingsError
from cronbox.outbox.core.sql import insert_ignore
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.models import ConcurrencyGroupSlot, RateWindow
from cronbox.outbox.queue.ratelimit import RateLimit

S = ConcurrencyGroupSlot.__table__
R = RateWindow.__table__
GROUP_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}\Z")  # \Z: `$` would take a final newline
MAX_LIMIT = 1000  # slots are rows: a larger limit is no limit on a shared host
MAX_COST = 1_000_000
DEFAULT_WAIT = 2.0  # CRONBOX_GROUP_WAIT: a group-full job is tried again at most this much later
HOST = socket.gethostname()[:255]

# The gate's statements, built once (each job runs them: building them anew cost more than running
# them on SQLite); the values go in as parameters.
_HELD = {"holder": bindparam("b_holder"), "lease_until": bindparam("b_lease"), "taken_at": bindparam("b_now"),
         "host": bindparam("b_host"), "pid": bindparam("b_pid")}
_HAND_OVER = update(S).where(S.c.group_name == bindparam("b_group"), S.c.holder == bindparam("b_old")).values(_HELD)
_SLOTS = select(S.c.slot, S.c.holder, S.c.lease_until).where(S.c.group_name == bindparam("b_group"))
_FREE = S.c.holder.is_(None) | S.c.lease_until.is_(None) | (S.c.lease_until <= bindparam("b_now"))
_TAKE_FREE = (update(S).where(S.c.group_name == bindparam("b_group"), S.c.slot == bindparam("b_slot"), _FREE)
              .values(_HELD))
_SPEND = (update(R).where(R.c.bucket == bindparam("b_bucket"), R.c.window_start == bindparam("b_window"),
                          R.c.used + bindparam("b_cost") <= bindparam("b_limit"))
          .values(used=R.c.used + bindparam("b_cost")))


def check_group(group, limit, *, error=RegistrationError) -> None:
    """A group's name and limit, at registration (`error` RegistrationError) or dispatch (PayloadError)."""
    if not isinstance(group, str) or not GROUP_NAME.match(group):
        raise error(f"concurrency_group {group!r} must be 1-64 letters, digits, or _ . : -")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT):
        raise error(f"concurrency_limit must be an integer from 1 to {MAX_LIMIT}, not {limit!r}")


def check_cost(cost, *, error=RegistrationError) -> None:
    if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST:
        raise error(f"cost must be an integer from 1 to {MAX_COST}, not {cost!r}")


def limits(jobs) -> dict[str, int]:
    """Each group's limit, as the registered jobs declare it (they agree: job() checks)."""
    return {h.concurrency_group: h.concurrency_limit for h in jobs.all() if h.concurrency_group is not None}


def full_wait(settings) -> float:
    """CRONBOX_GROUP_WAIT: the longest a group-full job waits before it is tried again (seconds)."""
    return settings.number("CRONBOX_GROUP_WAIT", DEFAULT_WAIT, float, minimum=0.05)


def holder_of(item) -> str:
    """Who holds a slot: one attempt of one job (its id and claim token), never a worker."""
    return f"{item.id}:{item.claim_token}"


# ---- slots ---------------------------------------------------------------------------

def take(session: Session, group: str, limit: int, holder: str, lease_until: datetime, now: datetime, *,
         max_wait: float = DEFAULT_WAIT, handover: str | None = None) -> float | None:
    """Take a free slot of `group` for `holder` until `lease_until`: None when taken, else the seconds
    to wait before trying again (the soonest holder's lease end, at most `max_wait`).

    No UPDATE ... LIMIT 1 (SQLite has none, and MySQL would lock a range): the group's rows are read,
    then each free slot is tried with an UPDATE guarded by "still free", and each missing slot row is
    inserted already held (INSERT IGNORE / ON CONFLICT DO NOTHING). The rowcount says who won.
    Why that is safe: at READ COMMITTED (every cronbox transaction on MySQL) the SELECT reads the
    latest committed rows without locking; the guarded UPDATE then locks the slot's row and, if
    another taker's uncommitted UPDATE holds it, waits for that COMMIT and evaluates "still free"
    again on the new version, so it matches 0 rows: two takers never share a slot. Two inserts of a
    missing row meet on the primary key the same way (the second waits, then is ignored). SQLite
    runs the whole transaction under BEGIN IMMEDIATE, one writer at a time. The caller commits at
    once (the handler runs after), so a slot's row lock is held for one short transaction only.

    `handover`: a finished attempt of this worker whose slot (its ack not yet written) passes straight
    to `holder`, one UPDATE guarded by the old holder: the next job of the group in a batch costs no
    commit of its own for the release. Matching 0 rows (its lease ran out and another took it), the
    slot is taken as usual.
    """
    held = {"b_group": group, "b_holder": holder, "b_lease": lease_until, "b_now": now, "b_host": HOST,
            "b_pid": os.getpid()}
    if handover is not None and session.execute(_HAND_OVER, {**held, "b_old": handover}).rowcount == 1:
        return None
    rows = session.execute(_SLOTS, {"b_group": group}).all()
    live = [r for r in rows if r.holder is not None and r.lease_until is not None and r.lease_until > now]
    live_slots = {r.slot for r in live}
    # Slots at or over the limit belong to an older, larger limit: their live holders still count.
    if len(live) < limit:
        existing = {r.slot for r in rows}
        for slot in sorted(r.slot for r in rows if r.slot < limit and r.slot not in live_slots):
            if session.execute(_TAKE_FREE, {**held, "b_slot": slot}).rowcount == 1:
                return None
        row = {"group_name": group, "holder": holder, "lease_until": lease_until, "taken_at": now, "host": HOST,
               "pid": os.getpid()}
        for slot in range(limit):
            if slot not in existing and insert_ignore(session, S, {**row, "slot": slot}).rowcount == 1:
                return None
    soonest = min((r.lease_until for r in live), default=None)
    wait = (soonest - now).total_seconds() if soonest is not None else max_wait
    return min(max(wait, 0.05), max_wait)


def release(session: Session, held: list[tuple[str, str]]) -> int:
    """Free the slots these (group, holder) attempts hold (in the transaction of their ack / retry /
    give-up). The group names keep the UPDATE on the primary key's range: it locks those groups' few
    rows, never another group's (the holder is unique on its own: an attempt holds one slot)."""
    if not held:
        return 0
    return session.execute(update(S).where(S.c.group_name.in_({g for g, _ in held}),
                                           S.c.holder.in_([h for _, h in held]))
                           .values(holder=None, lease_until=None, taken_at=None, host=None, pid=None)).rowcount


def extend(session: Session, group: str, holder: str, lease_until: datetime) -> bool:
    """Keep a slot as long as its job's lease (extended together)."""
    return session.execute(update(S).where(S.c.group_name == group, S.c.holder == holder)
                           .values(lease_until=lease_until)).rowcount == 1


# ---- cost budgets --------------------------------------------------------------------

@dataclass(frozen=True)
class CostBudget:
    scope: str  # "queue" or "group"
    name: str
    limit: int
    per_seconds: int

    @property
    def bucket(self) -> str:
        """Its cronbox_rate_windows bucket (64 characters at most: a long name is hashed)."""
        bucket = f"budget:{self.scope}:{self.name}"
        if len(bucket) <= 64:
            return bucket
        return f"budget:{self.scope}:sha256:{hashlib.sha256(self.name.encode()).hexdigest()[:40]}"

    @property
    def spec(self) -> str:
        unit = {1: "s", 60: "m", 3600: "h"}.get(self.per_seconds)
        return f"{self.limit}/{unit}" if unit else f"{self.limit}/{self.per_seconds}s"

    def window_of(self, now: datetime) -> int:
        return int(calendar.timegm(now.timetuple()) // self.per_seconds) * self.per_seconds

    def charge(self, session: Session, cost: int, now: datetime) -> float | None:
        """Spend `cost` in the current window: None when it fit, else the seconds until the window
        ends. The guarded UPDATE takes the window row's lock, so concurrent workers add their costs
        one after the other, and each sees the sum the previous one committed (READ COMMITTED)."""
        window = self.window_of(now)
        spend = {"b_bucket": self.bucket, "b_window": window, "b_cost": cost, "b_limit": self.limit}
        if session.execute(_SPEND, spend).rowcount == 1:  # the row exists (all but a window's first job)
            return None
        # No row yet (the window's first job), or over the limit: make sure the row exists and try again.
        # Again even when the INSERT was ignored: another worker may have just inserted it (its INSERT's
        # key lock made ours wait for its COMMIT), and each statement at READ COMMITTED reads afresh.
        insert_ignore(session, R, {"bucket": self.bucket, "window_start": window, "used": 0})
        if session.execute(_SPEND, spend).rowcount == 1:
            return None
        stamp = calendar.timegm(now.timetuple()) + now.microsecond / 1e6
        return max(window + self.per_seconds - stamp, 0.05)

    def used(self, session: Session, now: datetime) -> int:
        return session.scalar(select(R.c.used).where(R.c.bucket == self.bucket,
                                                     R.c.window_start == self.window_of(now))) or 0


QUEUE_BUDGETS, GROUP_BUDGETS = "CRONBOX_QUEUE_BUDGETS", "CRONBOX_GROUP_BUDGETS"


def budgets(settings) -> dict[tuple[str, str], CostBudget]:
    """The configured budgets by (scope, name); SettingsError naming the setting for a bad value."""
    return {**_parse(QUEUE_BUDGETS, "queue", settings.get(QUEUE_BUDGETS)),
            **_parse(GROUP_BUDGETS, "group", settings.get(GROUP_BUDGETS))}


@functools.lru_cache(maxsize=32)
def _parse(setting: str, scope: str, raw: str | None) -> dict[tuple[str, str], CostBudget]:
    """"sms=100/m, mail=2000/h" (the rate limits' syntax: N/s, N/m, N/h, N/10s)."""
    out: dict[tuple[str, str], CostBudget] = {}
    for part in (raw or "").split(","):
        if not part.strip():
            continue
        name, equals, spec = part.partition("=")
        name = name.strip()
        if not equals or not GROUP_NAME.match(name):
            raise SettingsError(f"{setting}: {part.strip()!r} must look like NAME=100/m (NAME: 1-64 letters, "
                                f"digits, or _ . : -)")
        if (scope, name) in out:
            raise SettingsError(f"{setting}: {name} is given twice")
        try:
            rate = RateLimit.parse(spec, bucket=name)
        except RegistrationError:
            raise SettingsError(f"{setting}: {name}={spec.strip()!r} must look like 100/m, 10/s, 500/h or "
                                f"50/10s") from None
        out[(scope, name)] = CostBudget(scope, name, rate.limit, rate.per_seconds)
    return out


# ---- what CLI, console and metrics show -------------------------------------------------

@dataclass
class ConcurrencyGroupUse:
    name: str
    limit: int | None  # None: jobs name it, but no registered job declares it
    in_use: int = 0
    waiting: int = 0  # ready jobs of the group (due or deferred)


def overview(session: Session, jobs, now: datetime) -> list[ConcurrencyGroupUse]:
    """Each registered group (and any group a waiting job or a live slot names): limit, slots in use
    now (live leases), ready jobs waiting for it. Reads the slot rows (a few per group) and one
    GROUP BY over the ready jobs (jobstore.waiting_per_group)."""
    declared = limits(jobs)
    out = {name: ConcurrencyGroupUse(name, limit) for name, limit in sorted(declared.items())}
    live = session.execute(select(S.c.group_name, S.c.holder).where(S.c.holder.is_not(None),
                                                                   S.c.lease_until > now)).all()
    for group, _ in live:
        out.setdefault(group, ConcurrencyGroupUse(group, declared.get(group))).in_use += 1
    handlers = {h.name: h.concurrency_group for h in jobs.all() if h.concurrency_group is not None}
    for group, count in jobstore.waiting_per_group(session, handlers).items():
        out.setdefault(group, ConcurrencyGroupUse(group, declared.get(group))).waiting = count
    return [out[name] for name in sorted(out)]


@dataclass
class BudgetUse:
    budget: CostBudget
    used: int
    resets_in: float


def budget_overview(session: Session, settings, now: datetime) -> list[BudgetUse]:
    stamp = calendar.timegm(now.timetuple()) + now.microsecond / 1e6
    return [BudgetUse(b, b.used(session, now), b.window_of(now) + b.per_seconds - stamp)
            for _, b in sorted(budgets(settings).items())]
