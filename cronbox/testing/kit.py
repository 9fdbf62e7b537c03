"""The test kit: a user's code run through cronbox's real claim, ack, retry and fan-out SQL, on the
user's own test database, in the test's process.

It stands on cronbox's stable entry points only: a relay's run (`Relay.run`), a worker's run
(`Worker.run`), the tick (`run_tick`), the stores' read models (`deliveries`, `jobstore`, `batches`), the
runtime and the clock. A Flask app's runtime is the one its extension keeps
(`app.extensions["cronbox"]`): handlers run in the app's context with the host's `db.session` as
their ctx.session, as in a cron process.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Iterator, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.orm import Session, scoped_session, sessionmaker
from sqlalchemy.pool import NullPool

from cronbox.outbox.channels.captured import SENT
from cronbox.outbox.core import clock as core_clock
from cronbox.outbox.core.engines import make_engine, session_factory
from cronbox.outbox.core.inserts import new_trace_id
from cronbox.outbox.core.migrate import SCHEMA_HEAD, current_revision, upgrade
from cronbox.outbox.core.payload import dump_payload, load_payload
from cronbox.outbox.core.sealing import open_payload
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.context import Context
from cronbox.outbox.engine.handler_call import call_handler
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.events import deliveries
from cronbox.outbox.events.relay import FAN_OUT_BATCH, Relay
from cronbox.outbox.queue import batches, jobstore
from cronbox.outbox.queue.batches import Progress
from cronbox.outbox.queue.worker import Worker

from .outbox import Outbox
from .rows import (DrainLoop, EventRow, JobRow, KitError, account, describe_event, describe_job, differences,
                   event_rows, job_rows, wanted)
from .timing import Clock

RUN_LIMIT = 500  # handler calls one deliver() or drain() may make before it calls its work a loop
TICK_MAX_TIME = 30.0  # a tick's --max-time: it ends sooner (no linger) unless its work never does
MANUAL, INLINE = "manual", "inline"
_ACTIVE: list[Kit] = []  # the kits started, innermost last: the module-level functions use it

T = TypeVar("T")


@dataclass(frozen=True)
class Ran:
    """What one deliver() / drain() did (deliveries or jobs)."""

    done: int = 0
    retried: int = 0  # failed, to be tried again after their backoff
    deferred: int = 0  # RetryLater: waiting again, no attempt used
    failed: int = 0  # dead deliveries / failed jobs

    @property
    def handled(self) -> int:
        return self.done + self.retried + self.deferred + self.failed

    def __add__(self, other: Ran) -> Ran:
        return Ran(self.done + other.done, self.retried + other.retried, self.deferred + other.deferred,
                   self.failed + other.failed)


@dataclass(frozen=True)
class Performed:
    """How one perform() call ended."""

    kind: str  # "ok", "retry-later", "permanent", "error" or "timeout"
    error: str | None  # "ExceptionClass: message", as a job row's last_error would say
    retry_in: float | None  # RetryLater's seconds
    seconds: float

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


@dataclass(frozen=True)
class Ticked:
    """What one tick() did: its summary line (as `python -m cronbox tick` prints it) and counts."""

    summary: str
    delivered: int
    jobs_done: int
    jobs_failed: int
    tasks: int
    one_off_runs: int


class Kit:
    """cronbox for one test: look at the rows the code committed, run its handlers, move the clock.

    `target`: a Flask app set up with `Cronbox().init_app(app, db=db)`, or a cronbox `Runtime` (outside
    Flask: `cronbox.outbox.Runtime(cronbox.outbox.load_settings(...))`) on the test database. `mode`:
    "manual" (nothing runs until the test says so) or "inline" (what a commit records or dispatches
    runs right after it, in the test's process). `session`: for inline mode, the session (a
    sessionmaker, scoped session or Session) the app writes through; a Flask app's is its `db.session`.
    `now`: where the frozen clock starts (naive UTC), default the real now. A kit works between
    start() and stop() (or `with Kit(app) as kit:`); the pytest fixtures do both.
    """

    def __init__(self, target: Any, *, mode: str = MANUAL, session: Any = None, now: datetime | None = None,
                 run_limit: int = RUN_LIMIT):
        if mode not in (MANUAL, INLINE):
            raise KitError(f"mode must be {MANUAL!r} or {INLINE!r}, not {mode!r}")
        self.runtime, self._host_db = _runtime_of(target)
        self._mode = mode
        self._session = session
        self._start_at = now
        self.run_limit = run_limit
        self.clock = Clock(moved=self._clock_moved)
        self.outbox = Outbox(self.runtime.settings)
        self._stack: contextlib.ExitStack | None = None
        self._reads: sessionmaker[Session] | None = None
        self._read_engine: Engine | None = None
        self._schema_ok = False
        self._busy = False  # running handlers: a commit inside them starts no inline run of its own
        self._watched: Any = None  # what inline mode listens to
        self._committed: set[int] = set()  # watched sessions whose transaction committed and has not ended yet
        self._side: sessionmaker[Session] | None = None  # see _side_sessions

    # ---- life ---------------------------------------------------------------------------------
    def start(self) -> Kit:
        """Freeze cronbox's clock, empty the test driver's outbox, become the kit the module-level
        functions use; in inline mode, watch the app's session."""
        if self._stack is not None:
            raise KitError("this kit is already started")
        stack = self._stack = contextlib.ExitStack()
        try:
            start = self._start_at or core_clock.utcnow()
            stack.enter_context(core_clock.frozen(start))
            SENT.clear()
            stack.callback(SENT.clear)
            self._read_engine = self._reading_engine()
            if self._read_engine is not self.runtime.engine:
                stack.callback(self._read_engine.dispose)
            self._reads = sessionmaker(self._read_engine)
            _ACTIVE.append(self)
            stack.callback(_ACTIVE.remove, self)
            if self._mode == INLINE:
                self._mode = MANUAL
                stack.enter_context(self.inline(self._session))
        except BaseException:
            self._stack = None
            stack.close()
            raise
        return self

    def stop(self) -> None:
        """Undo start(); in inline mode, fail if a commit the kit never saw left work behind."""
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def __enter__(self) -> Kit:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def mode(self) -> str:
        return self._mode

    def migrate(self) -> None:
        """Bring the test database to the schema this cronbox needs (`python -m cronbox migrate`)."""
        lock = self.runtime.lock("migrate")
        if not lock.acquire():
            raise KitError("another process is migrating this database")
        try:
            upgrade(self.runtime.settings, self.runtime.engine)
        finally:
            lock.release()
        self._schema_ok = True

    # ---- looking ------------------------------------------------------------------------------
    def recorded(self, type: str | None = None, /, **payload_match: Any) -> list[EventRow]:
        """The events committed so far (of `type`, whose payload has each given key equal to its value),
        in the order recorded, each with its deliveries."""
        return [row for row in self._events(type) if not differences(row.payload, payload_match)]

    def dispatched(self, job: Any = None, /, *, queue: str | None = None, **payload_match: Any) -> list[JobRow]:
        """The jobs committed so far (of `job`: a @job function or its name; on `queue`; whose payload has
        each given key equal to its value), in the order dispatched, with their status and last error."""
        return [row for row in self._jobs(_job_name(job), queue) if not differences(row.payload, payload_match)]

    def assert_recorded(self, type: str | None = None, /, **payload_match: Any) -> list[EventRow]:
        """The matching events (at least one); else AssertionError listing the events that were there."""
        every = self._events(None)
        matching, why = _sorted(every, lambda row: ([f"type is {row.type!r}"] if type not in (None, row.type) else [])
                                + differences(row.payload, payload_match))
        if not matching:
            raise AssertionError(f"no {wanted('event', type, payload_match)} was recorded\n"
                                 + account(every, describe_event, why, "events"))
        return matching

    def refute_recorded(self, type: str | None = None, /, **payload_match: Any) -> None:
        """AssertionError, listing them, if any matching event was recorded."""
        matching = self.recorded(type, **payload_match)
        if matching:
            raise AssertionError(f"{wanted('event', type, payload_match)} was recorded {len(matching)} time(s), "
                                 f"expected none\n" + account(matching, describe_event, {}, "matching events"))

    def assert_dispatched(self, job: Any = None, /, *, queue: str | None = None,
                          **payload_match: Any) -> list[JobRow]:
        """The matching jobs (at least one); else AssertionError listing the jobs that were there."""
        name = _job_name(job)
        every = self._jobs(None, None)
        matching, why = _sorted(every, lambda row: ([f"job is {row.job!r}"] if name not in (None, row.job) else [])
                                + ([f"queue is {row.queue!r}"] if queue not in (None, row.queue) else [])
                                + differences(row.payload, payload_match))
        if not matching:
            where = f" on queue {queue!r}" if queue is not None else ""
            raise AssertionError(f"no {wanted('job', name, payload_match, where)} was dispatched\n"
                                 + account(every, describe_job, why, "jobs"))
        return matching

    def refute_dispatched(self, job: Any = None, /, *, queue: str | None = None, **payload_match: Any) -> None:
        """AssertionError, listing them, if any matching job was dispatched."""
        matching = self.dispatched(job, queue=queue, **payload_match)
        if matching:
            where = f" on queue {queue!r}" if queue is not None else ""
            raise AssertionError(f"{wanted('job', _job_name(job), payload_match, where)} was dispatched "
                                 f"{len(matching)} time(s), expected none\n"
                                 + account(matching, describe_job, {}, "matching jobs"))

    def batch(self, batch: Any) -> Progress:
        """The progress of `batch` (a `cronbox.batch()`, `ctx.batch`, or its id), read from committed rows:
        `done`, `failed`, `cancelled`, `pending`, `total`, `state` (running, cancelling, finished,
        cancelled); KitError if there is no such batch."""
        batch_id = getattr(batch, "id", batch)
        self._ready()
        found = self._read(lambda s: batches.progress(s, batch_id))
        if found is None:
            raise KitError(f"no batch {batch_id!r} was committed")
        return found

    def assert_batch_finished(self, batch: Any) -> Progress:
        """The progress of `batch` once finished (its callbacks dispatched: drain() runs them); else
        AssertionError with its counts and the members not finished."""
        progress = self.batch(batch)
        if progress.finished_at is None:
            waiting = self._read(lambda s: batches.members_page(s, progress.id, size=20).rows)
            raise AssertionError(
                f"batch {progress.id} {progress.name!r} is {progress.state}: done {progress.done}, failed "
                f"{progress.failed}, cancelled {progress.cancelled}, pending {progress.pending} of {progress.total}\n"
                + "\n".join(f"  #{m.id} {m.handler} ({m.status}, attempts {m.attempts})"
                            + (f" {m.last_error}" if m.last_error else "")
                            for m in waiting if m.status not in ("done", "failed"))
                + ("\n  (drain() runs them; a retry waits for its backoff: drain(until=...))" if progress.pending else ""))
        return progress

    # ---- running ------------------------------------------------------------------------------
    def deliver(self, type: str | None = None) -> Ran:
        """Run the due deliveries of in-process consumers (of `type`'s consumers only, when given), as the
        tick's relay does: fan-out, claim, the consumer, ack or retry. A delivery that fails waits for its
        backoff (move the clock, deliver again). Follows the events consumers record, to run_limit calls."""
        self._ready()
        with self._running():
            return self._deliver(type)

    def drain(self, queue: str | None = None, until: datetime | timedelta | None = None) -> Ran:
        """Run the due jobs (of `queue`, default every queue a worker serves), as the worker does: claim,
        gate (pauses, rate limits, groups), the job, ack or retry; jobs their handlers dispatch run too, to
        run_limit calls. `until` (a time, or a duration from now): also run what comes due up to then,
        moving the clock to each due time (retries after their backoff, delay=), and leave it there."""
        self._ready()
        with self._running():
            return self._drain(queue, until)

    def perform(self, job: Any, payload: Any = None, *, attempt: int = 1) -> Performed:
        """Call one job function once, as the worker would: a real Context on a transaction of the test
        database, ctx.session's writes committed when it succeeds and rolled back when it does not, and
        how it ended. No job row: retries and backoff are drain()'s (dispatch, then drain)."""
        self._ready()
        handler = self.runtime.jobs.get(_job_name(job) or "")
        if handler is None:
            raise KitError(f"no job {_job_name(job)!r} is registered in this app's runtime "
                           f"(registered: {', '.join(self.runtime.jobs.names()) or 'none'})")
        body = load_payload(dump_payload(payload))  # a payload dispatch() would refuse is refused here too
        trace = new_trace_id()
        with self._running(), self.runtime.engine.connect() as connection:
            ctx = Context(attempt=attempt, trace_id=trace, idempotency_key=f"job-perform-{trace}",
                          connection=connection, settings=self.runtime.settings)
            try:
                outcome = call_handler(handler.fn, (body, ctx), timeout=handler.timeout,
                                       scope=self.runtime.scope_for(ctx))
                kind, error = outcome.kind, outcome.error
                if outcome.ok and ctx.transaction is not None:
                    kind, error = _commit_writes(ctx)
            finally:
                ctx.discard_session()
        return Performed(kind, error, outcome.retry_in, outcome.seconds)

    def tick(self) -> Ticked:
        """One whole tick in the test's process, as `python -m cronbox tick --no-linger` runs it: the
        scheduler (periodic tasks of their current slot), one-off runs, the relay, the worker; its lock
        taken without waiting (KitError when another tick holds it), no linger."""
        self._ready()
        from cronbox.cron.cli import main as run_command
        from cronbox.cron.scheduling.tick import run_tick
        from cronbox.outbox.queue.pool import tick_workers

        if tick_workers(self.runtime.settings) > 1:
            raise KitError("tick() runs in the test's process: unset CRONBOX_TICK_WORKERS for tests")
        with self._running():
            report = run_tick(self.runtime, run_command=run_command, max_time=TICK_MAX_TIME, linger=False,
                              memory_mb=None)
        if report.skipped or report.result is None:
            raise KitError("tick skipped: another tick holds this database's tick lock (a cron line or a "
                           "`python -m cronbox tick` running against the test database?)")
        summary = report.summary()
        if report.exit_code:
            raise KitError(f"the tick failed: {summary}")
        relay, worker = report.relay.stats, report.worker.stats  # type: ignore[union-attr]
        return Ticked(summary, relay.done, worker.done, worker.gave_up, report.scheduler.ran,  # type: ignore[union-attr]
                      report.once.ran)  # type: ignore[union-attr]

    # ---- modes --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def inline(self, session: Any = None) -> Iterator[Kit]:
        """Inline mode for the block: a commit of `session` (default: the app's `db.session`) runs what
        is due right after it (deliveries, then jobs, until nothing is due), in the test's process, and
        moving the clock runs what came due. Leaving the block fails if work was committed that no
        watched commit ran (written through another session)."""
        self._active_or_fail()
        if self._mode == INLINE:
            raise KitError("the kit is in inline mode already")
        target = self._watch_target(session)
        committed, ended = self._after_commit, self._after_transaction_end
        event.listen(target, "after_commit", committed)
        event.listen(target, "after_transaction_end", ended)
        self._mode, self._watched = INLINE, target
        try:
            yield self
            self._check_inline()
        finally:
            event.remove(target, "after_commit", committed)
            event.remove(target, "after_transaction_end", ended)
            self._mode, self._watched, self._committed = MANUAL, None, set()

    # ---- inside -------------------------------------------------------------------------------
    def _deliver(self, type: str | None) -> Ran:
        everything = self.runtime.registry
        unregistered = self._read(lambda s: deliveries.unregistered_due(s, everything.consumers, core_clock.utcnow()))
        if unregistered:
            raise KitError("deliveries are due for consumers not registered in this app's runtime, so no relay "
                           "here runs them: " + ", ".join(f"{name} ({count})" for name, count in unregistered)
                           + " (is the module that declares them in CRONBOX_HANDLERS, or imported?)")
        last_event = max((row.id for row in self._events(None)), default=0)
        budget = Budget(max_time=None, memory_mb=None, max_handled=self.run_limit)
        if type is None:
            relay = Relay(self.runtime)
            relay.run(budget)
        else:
            relay = self._deliver_only(type, budget)
        if budget.stop_reason() == "max-jobs" and self._read(lambda s: deliveries.backlog(s, core_clock.utcnow())):
            since = Counter(row.type for row in self._events(None) if row.id > last_event)
            raise DrainLoop(f"deliver() ran {budget.handled} consumers and deliveries are still due: consumers "
                            f"that record events for each other without end? Recorded meanwhile: "
                            + (", ".join(f"{t} x{n}" for t, n in since.most_common(5)) or "nothing"))
        stats = relay.stats
        return Ran(stats.done, stats.retried, stats.deferred, stats.gave_up)

    def _deliver_only(self, type: str, budget: Budget) -> Relay:
        """A relay claiming only the deliveries of `type`'s consumers. The relay claims from the runtime's
        registry, so for the run that registry is a view holding only those consumers; every event is
        fanned out to all of its consumers before each of the relay's batches (its own fan-out then finds
        none), so no other consumer misses an event recorded meanwhile."""
        everything = self.runtime.registry
        takers = {c.name for c in everything.consumers.for_type(type)}
        if not takers:
            raise KitError(f"no consumer registered in this app's runtime takes {type!r} events (consumers: "
                           f"{', '.join(everything.consumers.names()) or 'none'})")
        consumers = {id(c) for c in everything.consumers.in_order()}
        only = Registry(everything, keep=lambda item: id(item) not in consumers or item.name in takers)
        sessions = self._side_sessions()  # the relay holds a connection of the runtime's pool for its run

        def fan_out_to_all() -> None:
            while in_transaction(sessions, lambda s: deliveries.fan_out(
                    s, everything.consumers, core_clock.utcnow(), FAN_OUT_BATCH))[0]:
                pass

        self.runtime.registry = only
        try:
            relay = Relay(self.runtime, before_batch=fan_out_to_all)
            relay.run(budget)
        finally:
            self.runtime.registry = everything
        return relay

    def _drain(self, queue: str | None, until: datetime | timedelta | None) -> Ran:
        jobs = self.runtime.jobs
        queues = [queue] if queue is not None else self.runtime.default_queues()
        asked = [queue] if queue is not None else None  # every queue: one no job here runs on is still a mistake
        unregistered = self._read(lambda s: jobstore.unregistered_due(s, jobs, asked, core_clock.utcnow()))
        if unregistered:
            raise KitError("jobs are due that no job registered in this app's runtime can run: "
                           + ", ".join(f"{handler} on {q} ({n})" for q, handler, n in unregistered)
                           + " (is the module that declares them in CRONBOX_HANDLERS, or imported?)")
        if queue is not None and queue not in jobs.queues():
            raise KitError(f"no job registered in this app's runtime runs on queue {queue!r} "
                           f"(queues: {', '.join(jobs.queues()) or 'none'})")
        end = core_clock.utcnow() + until if isinstance(until, timedelta) else until
        if end is not None and end < core_clock.utcnow():
            raise KitError(f"drain(until={until!r}) is in the past (now: {core_clock.utcnow()})")
        last_job = max((row.id for row in self._jobs(None, None)), default=0)
        total, calls = Ran(), 0
        while True:
            budget = Budget(max_time=None, memory_mb=None, max_handled=max(self.run_limit - calls, 1))
            worker = Worker(self.runtime, queues)
            worker.run(budget)
            calls += budget.handled
            stats = worker.stats
            total += Ran(stats.done, stats.retried, stats.deferred, stats.gave_up)
            now = core_clock.utcnow()
            if calls >= self.run_limit and self._read(lambda s: jobstore.next_due(s, jobs, queues, end or now)):
                since = Counter(row.job for row in self._jobs(None, None) if row.id > last_job)
                raise DrainLoop(f"drain() ran {calls} jobs and jobs are still due: jobs that dispatch each other "
                                f"(or retry later) without end? Dispatched meanwhile: "
                                + (", ".join(f"{j} x{n}" for j, n in since.most_common(5)) or "nothing"))
            if end is None:
                break
            due = self._read(lambda s: jobstore.next_due(s, jobs, queues, end))
            if due is None or (due <= now and not budget.handled):
                break  # nothing more before `end`, or what is due cannot be claimed now (held by a lease)
            if due > now:
                core_clock.advance((due - now).total_seconds())
        if end is not None and end > core_clock.utcnow():
            core_clock.advance((end - core_clock.utcnow()).total_seconds())
        return total

    def _settle(self) -> None:
        """Inline mode: deliveries, then jobs, again while either ran something."""
        with self._running():
            for _ in range(self.run_limit):
                if not (self._deliver(None) + self._drain(None, None)).handled:
                    return
        raise DrainLoop("inline mode ran deliveries and jobs round after round and work was still due")

    def _after_commit(self, session: Session) -> None:
        """A watched session committed: run what it wrote once its transaction has ended (below). At
        after_commit the session still holds its connection, which may be the one connection of the
        pool cronbox's run needs (an app writing through the runtime's own sessions)."""
        if not self._busy:
            self._committed.add(id(session))

    def _after_transaction_end(self, session: Session, transaction: Any) -> None:
        if transaction.parent is None and id(session) in self._committed:
            self._committed.discard(id(session))
            if not self._busy and self._stack is not None:
                self._settle()

    def _clock_moved(self) -> None:
        if self._mode == INLINE and not self._busy:
            self._settle()

    def _check_inline(self) -> None:
        """Work committed that no watched commit ran: the app wrote it through another session."""
        handlers = [h.name for h in self.runtime.jobs.all() if h.queue in self.runtime.default_queues()]
        now = core_clock.utcnow()
        events, jobs = self._read(lambda s: (deliveries.unfanned_count(s), jobstore.never_claimed_due(s, handlers, now)))
        if events or jobs:
            raise KitError(f"inline mode: {events} event(s) and {jobs} job(s) were committed and never ran: they were "
                           f"written through a session inline mode does not watch (it watches {self._watched!r}); "
                           "pass the session the app writes through (Kit(..., session=...), kit.inline(session))")

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        previous, self._busy = self._busy, True
        try:
            yield
        finally:
            self._busy = previous

    def _watch_target(self, session: Any) -> Any:
        if session is None:
            if self._host_db is None:
                raise KitError("inline mode needs the session the app writes through: pass session= (a Flask "
                               "app set up with Cronbox().init_app(app, db=db) is watched through its db.session)")
            return self._host_db.session
        bind = _bind_of(session)
        if bind is not None and not _same_database(bind.url, self.runtime.engine.url):
            raise KitError(f"inline mode: the session given writes to {bind.url.render_as_string()}, but cronbox "
                           f"runs on {self.runtime.engine.url.render_as_string()}: pass the session the app writes "
                           "through")
        return session

    def _active_or_fail(self) -> None:
        if self._stack is None:
            raise KitError("this kit is not started: use the cronbox_kit fixture, `with Kit(app) as kit:`, or "
                           "kit.start()")

    def _ready(self) -> None:
        """Started, on a migrated database; in inline mode, with nothing committed behind its back."""
        self._active_or_fail()
        if not self._schema_ok:
            revision = current_revision(self._read_engine)  # type: ignore[arg-type]
            if revision != SCHEMA_HEAD:
                found = "has no cronbox tables" if revision is None else f"is at cronbox schema {revision}"
                raise KitError(f"the test database {found}; this cronbox needs {SCHEMA_HEAD}: migrate it first "
                               "(kit.migrate(), or `python -m cronbox migrate` against it)")
            self._schema_ok = True
        if self._mode == INLINE and not self._busy:
            self._check_inline()

    def _events(self, type: str | None) -> list[EventRow]:
        self._ready()
        return event_rows(self._read(lambda s: deliveries.recorded(s, type=type)), self._open)

    def _jobs(self, name: str | None, queue: str | None) -> list[JobRow]:
        self._ready()
        return job_rows(self._read(lambda s: jobstore.listed(s, handler=name, queue=queue)), self._open)

    def _open(self, table: str, name: str, seal_id: str | None, text: str):
        """A sealed payload opened as its handler would get it, under the runtime's keys."""
        return self._read(lambda s: open_payload(self.runtime, table, name, seal_id, text, s.connection()))

    def _read(self, work: Callable[[Session], T]) -> T:
        """A read of committed rows, never waiting on the app's open transaction (see _reading_engine)."""
        assert self._reads is not None
        with self._reads() as session:
            return work(session)

    def _side_sessions(self) -> sessionmaker[Session]:
        """Sessions on a connection of the kit's own (cronbox's engine set-up, one connection), for a write
        while a run holds the runtime's: made on first use, closed by stop()."""
        if self._side is None:
            engine = make_engine(self.runtime.settings, role="cron", url=self.runtime.engine.url.render_as_string(
                hide_password=False))
            self._side = session_factory(engine)
            assert self._stack is not None
            self._stack.callback(engine.dispose)
        return self._side

    def _reading_engine(self) -> Engine:
        """On a server, cronbox's own engine (READ COMMITTED). On SQLite, an engine of plain reads: cronbox's
        begins every transaction with BEGIN IMMEDIATE, which would wait for a write transaction the test
        holds open; a WAL reader sees the last commit at once, without waiting."""
        if self.runtime.is_server:
            return self.runtime.engine
        return create_engine(self.runtime.engine.url, poolclass=NullPool)


def _runtime_of(target: Any) -> tuple[Runtime, Any]:
    """(the runtime, the host's Flask-SQLAlchemy object or None) of a Flask app or a Runtime."""
    if isinstance(target, Runtime):
        return target, None
    extensions = getattr(target, "extensions", None)
    if isinstance(extensions, dict):
        state = extensions.get("cronbox")
        if state is None:
            raise KitError("this Flask app has no cronbox: call Cronbox().init_app(app, db=db) in its factory")
        return state.runtime, state.db
    raise KitError(f"Kit() takes a Flask app set up with Cronbox().init_app(app), or a cronbox Runtime, not "
                   f"{type(target).__name__}")


def _job_name(job: Any) -> str | None:
    """A job's name from its name, its @job function (`send_sms`) or its handler."""
    if job is None or isinstance(job, str):
        return job
    handler = getattr(job, "job", job)
    name = getattr(handler, "name", None)
    if not isinstance(name, str):
        raise KitError(f"{job!r} is not a job: pass a @job function or a job's name")
    return name


def _sorted(rows: list, reasons: Callable[[Any], list[str]]) -> tuple[list, dict[int, list[str]]]:
    """(the rows with no reason against them, each other row's reasons by id)."""
    why = {row.id: reasons(row) for row in rows}
    return [row for row in rows if not why[row.id]], why


def _commit_writes(ctx: Context) -> tuple[str, str | None]:
    """perform(): commit what ctx.session wrote, as the worker's ack would (a session the handler left
    failed, or a commit that fails, is a failed attempt)."""
    transaction = ctx.transaction
    assert transaction is not None
    if transaction.session.failed_with is not None:
        return "error", (f"the handler left ctx.session failed (call rollback() after catching a database "
                         f"error): {transaction.session.failed_with}")
    try:
        transaction.commit()
    except Exception as exc:  # the writes failed at commit (a constraint): the attempt failed
        return "error", f"commit failed: {type(exc).__name__}: {exc}"
    return "ok", None


def _bind_of(session: Any) -> Engine | None:
    """The engine a session (factory) writes to, when it can be told without touching the app's own
    sessions; None for a Session class."""
    if isinstance(session, scoped_session):
        session = session.session_factory
    if isinstance(session, type):
        return None
    probe = session() if isinstance(session, sessionmaker) else session
    try:
        bind = probe.get_bind()
    except UnboundExecutionError:
        raise KitError("inline mode: the session given is bound to no database") from None
    finally:
        if probe is not session:
            probe.close()
    return bind if isinstance(bind, Engine) else bind.engine


def _same_database(a: Any, b: Any) -> bool:
    """Two URLs naming one database, whichever driver each names (cronbox's engines use psycopg 3)."""
    a, b = make_url(a), make_url(b)
    return (a.get_backend_name(), a.host, a.port or None, a.database) == (b.get_backend_name(), b.host,
                                                                           b.port or None, b.database)


def current() -> Kit:
    """The kit started last (the fixture's); KitError when none is."""
    if not _ACTIVE:
        raise KitError("no cronbox test kit is started: ask for the cronbox_kit fixture, or use "
                       "`with cronbox.testing.Kit(app) as kit:`")
    return _ACTIVE[-1]
