"""Periodic tasks run by the tick, each at most once per slot.

    from cronbox.cron.scheduling import schedule

    @schedule.every(minutes=5)
    def refresh_rates(ctx): ...

    @schedule.cron("0 3 * * *", tz="Asia/Tehran", name="settle_escrow")
    def settle(ctx): ...          # one synchronous, status-guarded transaction via ctx.session

A slot is the latest scheduled instant at or before now (every N minutes: a
multiple of N since the epoch, in UTC; cron: croniter's previous fire time in
the task's timezone). Running a slot first inserts the row (task, slot) with a
unique key: whoever inserts it runs it, everyone else skips, so overlapping
ticks or several servers never run a slot twice. Only the latest slot is ever
considered, so after coarse cron or downtime a task runs once, not once per
missed slot. A task's ctx.session commits when the task returns.
"""
from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Protocol, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Table, delete, select, tuple_, update
from sqlalchemy.orm import Session

from cronbox.cron.scheduling.models import ScheduleRun
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.core.inserts import new_trace_id
from cronbox.outbox.core.logs import log_text
from cronbox.outbox.core.sql import insert_ignore_id
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.handler_call import Outcome, call_handler
from cronbox.outbox.engine.registry import DEFAULT, Registry

log = logging.getLogger("cronbox")
R = cast(Table, ScheduleRun.__table__)
NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}\Z")  # \Z: `$` would take a final newline
EPOCH = datetime(1970, 1, 1)


@dataclass(frozen=True)
class Task:
    name: str
    fn: Callable = field(repr=False)
    every_seconds: int | None = None
    cron: str | None = None
    tz: str | None = None
    timeout: float = 600

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron}" + (f" ({self.tz})" if self.tz else " (UTC)")
        return f"every {_human(self.every_seconds or 0)}"

    def slot(self, now: datetime) -> datetime:
        """The latest scheduled instant at or before `now` (naive UTC in, naive UTC out)."""
        if self.every_seconds is not None:
            elapsed = int((now - EPOCH).total_seconds())
            return EPOCH + timedelta(seconds=elapsed - elapsed % self.every_seconds)
        from croniter import croniter  # here: several MB a tick without cron-expression tasks never loads

        zone = ZoneInfo(self.tz or "UTC")
        local = now.replace(tzinfo=timezone.utc).astimezone(zone)
        # get_prev() is strictly before; step a second ahead so a slot exactly at `now` counts.
        previous = croniter(self.cron, local + timedelta(seconds=1)).get_prev(datetime)
        return previous.astimezone(timezone.utc).replace(tzinfo=None)

    def next_after(self, now: datetime) -> datetime:
        if self.every_seconds is not None:
            return self.slot(now) + timedelta(seconds=self.every_seconds)
        from croniter import croniter

        zone = ZoneInfo(self.tz or "UTC")
        local = now.replace(tzinfo=timezone.utc).astimezone(zone)
        return croniter(self.cron, local).get_next(datetime).astimezone(timezone.utc).replace(tzinfo=None)


def _human(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def every(*, minutes: int = 0, hours: int = 0, days: int = 0, name: str | None = None, timeout: float = 600,
          registry: Registry | None = None):
    """Run every N minutes/hours/days, on slots aligned to the epoch in UTC (every 5 min: :00, :05...)."""
    seconds = minutes * 60 + hours * 3600 + days * 86400
    if seconds < 60 or any(not isinstance(v, int) or v < 0 for v in (minutes, hours, days)):
        raise RegistrationError("schedule.every needs whole minutes, hours or days adding up to at least 1 minute")
    return _register(lambda task_name, fn: Task(task_name, fn, every_seconds=seconds, timeout=timeout), name, registry)


def cron(expression: str, *, tz: str | None = None, name: str | None = None, timeout: float = 600,
         registry: Registry | None = None):
    """Run on a cron expression (5 fields), in `tz` (an IANA name) or UTC."""
    from croniter import croniter

    if not isinstance(expression, str) or len(expression.split()) != 5 or not croniter.is_valid(expression):
        raise RegistrationError(f"{expression!r} is not a valid 5-field cron expression")
    if tz is not None:
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise RegistrationError(f"{tz!r} is not a known time zone (use an IANA name like Asia/Tehran)") from None
    return _register(lambda task_name, fn: Task(task_name, fn, cron=expression, tz=tz, timeout=timeout), name, registry)


class TaskFunction(Protocol):
    """A function `@schedule.every` or `@schedule.cron` registered: called as before, knows its name."""
    task_name: str

    def __call__(self, ctx: Any, /) -> Any: ...


def _register(make: Callable[[str, Callable[..., Any]], Task], name: str | None,
              registry: Registry | None) -> Callable[[Callable[..., Any]], TaskFunction]:
    def decorate(fn: Callable[..., Any]) -> TaskFunction:
        task_name = name or f"{fn.__module__}.{fn.__qualname__}"
        if not NAME.match(task_name):
            raise RegistrationError(f"task name {task_name!r} must be 1-100 letters, digits, or _ . : -")
        (registry or DEFAULT).tasks.add(make(task_name, fn))
        registered = cast(TaskFunction, fn)
        registered.task_name = task_name
        return registered

    return decorate


class TaskContext:
    """What a task receives: its slot, a trace id, the runtime, and a session committed on success."""

    def __init__(self, *, name: str, slot: datetime, runtime):
        self.name = name
        self.slot = slot
        self.trace_id = new_trace_id()
        self.runtime = runtime
        self.settings = runtime.settings
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = self.runtime.sessions()
        return self._session

    def finish(self, ok: bool) -> None:
        if self._session is None:
            return
        try:
            if ok:
                self._session.commit()
            else:
                self._session.rollback()
        finally:
            self._session.close()
            self._session = None


def claim_slot(session: Session, task: Task, slot: datetime, now: datetime) -> int | None:
    """Insert the (task, slot) row; its id if we won the slot, None if someone else has it."""
    return insert_ignore_id(session, R, {"task": task.name, "slot": slot, "status": "running", "started_at": now,
                                         "host": socket.gethostname()[:255], "pid": os.getpid()})


def run_task(runtime, task: Task, slot: datetime) -> str | None:
    """Run one slot of a task if nobody has; returns "ok", "error", or None when the slot was taken."""
    run_id = in_transaction(runtime.sessions, lambda s: claim_slot(s, task, slot, clock.utcnow()))
    if run_id is None:
        return None
    ctx = TaskContext(name=task.name, slot=slot, runtime=runtime)
    outcome = call_handler(task.fn, (ctx,), timeout=task.timeout, scope=runtime.scope_for(ctx))
    if outcome.ok:
        try:
            ctx.finish(True)
        except Exception as exc:  # the task's writes failed at commit: a failed run
            ctx.finish(False)
            outcome = Outcome("error", outcome.seconds, f"commit failed: {type(exc).__name__}: {exc}")
    else:
        ctx.finish(False)
    status = "ok" if outcome.ok else "error"
    in_transaction(runtime.sessions, lambda s: s.execute(
        update(R).where(R.c.id == run_id).values(status=status, finished_at=clock.utcnow(),
                                                 error=(outcome.error or None) and outcome.error[:1000])))
    line = f"task={task.name} slot={slot:%Y-%m-%dT%H:%M}Z outcome={status} trace={ctx.trace_id} " \
           f"ms={outcome.seconds * 1000:.0f}"
    if outcome.error:
        log.error("%s error=%r", line, log_text(outcome.error))
    else:
        log.info(line)
    return status


class Scheduler:
    """The tick's scheduler stage. It asks the database only when a task's slot changes, so
    lingering (a stage call every second) costs nothing between slots."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.tasks = runtime.registry.tasks
        self.seen: dict[str, datetime] = {}
        self.ran = 0
        self.failed = 0

    def run(self, budget: Budget) -> int:
        work = 0
        now = clock.utcnow()
        self._skip_taken({task.name: task.slot(now) for task in self.tasks.all()})
        for task in self.tasks.all():
            if budget.stop_reason() is not None:
                break
            slot = task.slot(clock.utcnow())
            if self.seen.get(task.name) == slot:
                continue
            self.seen[task.name] = slot
            status = run_task(self.runtime, task, slot)
            if status is not None:
                work += 1
                self.ran += 1
                self.failed += status == "error"
        return work

    def _skip_taken(self, slots: dict[str, datetime]) -> None:
        """Mark as seen the slots some run has already taken, in one SELECT, so that a fresh process
        (every tick) claims only the slots still free: one INSERT IGNORE and COMMIT each, where
        before it paid them for every task, due or not. A row read here is a slot claim_slot could
        not win (its unique key); a row inserted after this read still makes that INSERT a no-op."""
        new = {name: slot for name, slot in slots.items() if self.seen.get(name) != slot}
        if len(new) < 2:
            return  # one statement either way: the INSERT IGNORE itself
        taken = in_transaction(self.runtime.sessions, lambda s: s.execute(
            select(R.c.task, R.c.slot).where(tuple_(R.c.task, R.c.slot).in_(list(new.items())))).all())
        for name, slot in taken:
            if new.get(name) == slot:
                self.seen[name] = slot


@dataclass
class TaskStatus:
    task: Task
    last_slot: datetime | None
    last_status: str | None
    last_error: str | None
    next_due: datetime


def status(runtime) -> list[TaskStatus]:
    now = clock.utcnow()
    out = []
    with runtime.sessions() as session:
        for task in runtime.registry.tasks.all():
            last = session.execute(select(R.c.slot, R.c.status).where(R.c.task == task.name)
                                   .order_by(R.c.slot.desc()).limit(1)).first()
            error = session.scalar(select(R.c.error).where(R.c.task == task.name, R.c.status == "error")
                                   .order_by(R.c.slot.desc()).limit(1))
            slot = task.slot(now)
            next_due = slot if last is None or last.slot < slot else task.next_after(now)
            out.append(TaskStatus(task, last.slot if last else None, last.status if last else None,
                                  error, next_due))
    return out


def prune(session: Session, before: datetime, batch: int = 500) -> int:
    ids = list(session.scalars(select(R.c.id).where(R.c.started_at < before).order_by(R.c.id).limit(batch)))
    if ids:
        session.execute(delete(R).where(R.c.id.in_(ids)))
    return len(ids)

