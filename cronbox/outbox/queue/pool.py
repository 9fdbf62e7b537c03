"""A worker pool: one parent forks worker processes, supervises them, and scales them with the backlog.

`queue work --workers N` (or `--min-workers/--max-workers`) and the tick (CRONBOX_TICK_WORKERS) use
it where the host allows more than one process, so one cron line drains faster. The parent:
- keeps no database connection while children run: it disposes its pools before each fork, and opens a
  short-lived one for its heartbeat row and, when the pool can scale, a count of due jobs every few
  seconds; a tick's lock connection stays the parent's alone;
- restarts a child that crashed (non-zero exit, signal) with a backoff, at most RESTARTS_PER_MINUTE
  (a child that dies at start stops the pool with "crash-loop" instead of forking in a loop);
- passes SIGTERM/SIGINT on to its children (each finishes its current job) and waits for them;
- starts a child only if the pool's summed RSS plus one child's average stays under --memory, and stops
  its newest child (gracefully) when the sum passes it.
Each child drops everything it inherited (the runtime's and the host app's engines with
`dispose(close=False)`, the parent's lock: the socket or file descriptor is closed in the child only,
nothing is sent), opens its own connection, runs the ordinary worker loop with its own heartbeat row
("work"), and stops after its current job when the parent is gone (it polls os.getppid(): a SIGKILLed
parent leaves orphans otherwise). A child never returns into the parent's code: it leaves with os._exit.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from cronbox.outbox.core import clock
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.lock_wait import run_lock_waits
from cronbox.outbox.core.locks import RunLock
from cronbox.outbox.core.resources import rss_kb, rss_kb_of
from cronbox.outbox.core.settings import Settings
from cronbox.outbox.core.text import NAME_MAX, describe
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine import heartbeat
from cronbox.outbox.engine.admission import time_headroom
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.handler_process import flush_std_streams
from cronbox.outbox.engine.run_loop import RunResult, StopSignals, record_run, run_loop
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.worker import Worker

log = logging.getLogger("cronbox")

DEFAULT_MAX_CONNECTIONS = 5  # CRONBOX_MAX_CONNECTIONS: shared MySQL users get 3-10 (max_user_connections)
JOBS_PER_WORKER = 20  # the pool scales up by one worker per this many due jobs, down below it
SCALE_SECONDS = 3.0  # how often a pool that can scale counts due jobs and sums its memory
RESTARTS_PER_MINUTE = 10  # crashed children restarted per minute, at most; past it the pool stops
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 8.0  # seconds before restarting a crashed child, doubling per crash
EARLY_EXIT_SECONDS = 5.0  # without --stop-when-empty, a child ending sooner counts as a crash
PARENT_POLL = 0.5  # how often a child looks whether its parent is still there
SUPERVISE_POLL = 0.05


class PoolRefused(ValueError):
    """The pool asked for is not possible here (connection budget, bad sizes): a usage error."""


def max_connections(settings: Settings) -> int:
    return settings.number("CRONBOX_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS, int, minimum=1)


def tick_workers(settings: Settings) -> int:
    """CRONBOX_TICK_WORKERS: how many worker processes the tick may drain with (1: in its own process)."""
    return settings.number("CRONBOX_TICK_WORKERS", 1, int, minimum=1)


def check_budget(settings: Settings, workers: int, *, lock_connection: bool = False, what: str = "--workers") -> None:
    """Refuse a pool whose connections would pass CRONBOX_MAX_CONNECTIONS: one per child, one for
    the parent's short-lived heartbeat/count connection, and the run lock's when it holds one."""
    need = workers + 1 + (1 if lock_connection else 0)
    allowed = max_connections(settings)
    if need > allowed:
        lock = " + 1 for the tick's lock" if lock_connection else ""
        raise PoolRefused(f"{what} {workers} needs {need} database connections ({workers} workers + 1 for the "
                          f"pool{lock}), over CRONBOX_MAX_CONNECTIONS={allowed}; use at most "
                          f"{max(allowed - need + workers, 0)} or raise CRONBOX_MAX_CONNECTIONS")


@dataclass
class Child:
    pid: int
    started: float
    restart: bool


@dataclass
class PoolStats:
    started: int = 0  # children forked, restarts included
    restarts: int = 0  # of crashed children
    crashed: int = 0
    peak: int = 0  # most children alive at once
    not_started_memory: int = 0  # starts refused by the memory check
    pids: list[int] = field(default_factory=list)
    jobs_done: int = 0  # from the children's heartbeat rows, at the end
    jobs_failed: int = 0
    outcomes: list[str] = field(default_factory=list)

    def describe(self, min_workers: int, max_workers: int) -> str:
        size = f"{max_workers}" if min_workers == max_workers else f"{min_workers}-{max_workers}"
        return (f"workers {size} (peak {self.peak}), started {self.started}, restarts {self.restarts}, "
                f"jobs {self.jobs_done} done, {self.jobs_failed} failed")


class Pool:
    def __init__(self, runtime, queues: list[str] | None, *, min_workers: int, max_workers: int,
                 stop_when_empty: bool, sleep: float = 3.0, max_jobs: int | None = None,
                 memory_mb: float | None = None, parent_lock: RunLock | None = None,
                 check: Callable[[], None] | None = None):
        if not 1 <= min_workers <= max_workers:
            raise PoolRefused(f"--min-workers {min_workers} must be at least 1 and at most --max-workers {max_workers}")
        self.runtime = runtime
        self.queues = queues
        self.min_workers, self.max_workers = min_workers, max_workers
        self.stop_when_empty = stop_when_empty
        self.sleep = sleep
        self.max_jobs = max_jobs
        self.memory_kb = memory_mb * 1024 if memory_mb else None
        self.parent_lock = parent_lock  # a tick's lock: the children must never touch it
        self.check = check  # called every SCALE_SECONDS in the parent (the tick's lock.check)
        self.stats = PoolStats()
        self.children: dict[int, Child] = {}
        self._crash_times: list[float] = []
        self._restart_at: list[float] = []  # due restarts of crashed children (monotonic times)
        self._one_ended = False  # with stop_when_empty: a child found the queues empty
        self._stopping: str | None = None
        self._signalled_children = False
        self._target = min_workers
        self._parent_pid = os.getpid()

    # -- the parent ----------------------------------------------------------------
    def run(self, budget: Budget) -> RunResult:
        """Run the pool until it is done (stop_when_empty), --max-time, a signal or a crash loop, with its
        own heartbeat row ("pool", the pool's size and restarts in its detail)."""
        self.runtime.claim_mode()  # asked once here, inherited by every child
        with run_lock_waits(self.runtime.engine, budget.remaining):
            return record_run(self.runtime.sessions, "pool", lambda: self._supervise(budget), self._counts)

    def _counts(self) -> dict:
        return {"detail": self.stats.describe(self.min_workers, self.max_workers)[:NAME_MAX]}

    def _supervise(self, budget: Budget) -> RunResult:
        started_at = clock.utcnow()
        error: Exception | None = None
        self._release_connections()
        with StopSignals(budget):
            self._target = self._wanted(budget)
            next_scale = clock.monotonic() + SCALE_SECONDS
            while True:
                self._reap()
                if budget.signalled and not self._stopping:
                    self._stopping = budget.signalled
                if self._stopping not in (None, "max-time") and not self._signalled_children:
                    self._signal_children()  # at --max-time the children stop on their own
                if self._stopping is None and budget.remaining() <= 1.0:
                    self._stopping = "max-time"
                if self._stopping is None and clock.monotonic() >= next_scale:
                    next_scale = clock.monotonic() + SCALE_SECONDS
                    try:
                        if self.check is not None:
                            self.check()
                        if self.min_workers < self.max_workers:
                            self._target = self._wanted(budget)
                        self._scale_down()
                    except Exception as exc:  # the tick's lock lost, the database away: stop gracefully
                        log.error("pool: stopping the workers: %s", describe(exc))
                        error, self._stopping = exc, "error"
                        continue
                if self._stopping is None:
                    self._start_children(budget)
                if not self.children and (self._stopping or self._done()):
                    break
                time.sleep(SUPERVISE_POLL)
        self._collect(started_at)
        if error is not None:
            raise error
        reason = self._stopping or _summary_reason(self.stats.outcomes)
        exit_code = 1 if reason == "crash-loop" else 0
        log.info("pool: %s; stopped: %s", self.stats.describe(self.min_workers, self.max_workers), reason)
        return RunResult(stop_reason=reason, exit_code=exit_code,
                         error="workers kept crashing: see the cronbox log" if exit_code else None)

    def _done(self) -> bool:
        if self._restart_at:
            return False
        return self.stop_when_empty and self._one_ended

    def _release_connections(self) -> None:
        """The parent holds no idle pooled connection while children run (nor when it forks)."""
        self.runtime.engine.dispose()

    def _wanted(self, budget: Budget) -> int:
        """How many children the backlog asks for: one per JOBS_PER_WORKER due jobs, within min..max."""
        if self.min_workers == self.max_workers:
            return self.max_workers
        try:
            due = in_transaction(self.runtime.sessions, lambda s: jobstore.backlog(s, clock.utcnow()))
        finally:
            self._release_connections()
        return max(self.min_workers, min(self.max_workers, math.ceil(due / JOBS_PER_WORKER)))

    def _start_children(self, budget: Budget) -> None:
        now = clock.monotonic()
        while self._restart_at and self._restart_at[0] <= now:
            if not self._admit():
                return
            self._restart_at.pop(0)
            self.stats.restarts += 1
            self._fork(budget, restart=True)
        if self.stop_when_empty and self._one_ended:
            return  # a child found nothing due: no fresh ones, the pool is draining out
        while len(self.children) + len(self._restart_at) < self._target:
            if not self._admit():
                return
            self._fork(budget, restart=False)

    def _admit(self) -> bool:
        """The memory check: the pool's RSS (parent and children) plus one child's average under --memory."""
        if self.memory_kb is None:
            return True
        total, average = self._pool_rss()
        if total + average <= self.memory_kb:
            return True
        if not self.children:
            return True  # never refuse a lone one: one worker is what a plain `queue work` runs
        self.stats.not_started_memory += 1
        if self.stats.not_started_memory == 1:
            log.info("pool: not starting another worker: pool RSS %d MB + %d MB per worker would pass --memory "
                     "%d MB", total // 1024, average // 1024, self.memory_kb // 1024)
        return False

    def _pool_rss(self) -> tuple[float, float]:
        """(the pool's RSS, one child's average) in KiB. A child /proc cannot size (exiting: a zombie
        reads 0) counts as an average one; with no child sized yet, a child is the parent's size."""
        parent = rss_kb()
        sizes = [kb for kb in (rss_kb_of(pid) for pid in self.children) if kb]
        average = sum(sizes) / len(sizes) if sizes else parent
        return parent + sum(sizes) + average * (len(self.children) - len(sizes)), average

    def _scale_down(self) -> None:
        """Stop the newest child (after its current job) when the backlog wants fewer, or memory is over."""
        if len(self.children) <= 1:
            return
        over_memory = False
        if self.memory_kb is not None:
            over_memory = self._pool_rss()[0] > self.memory_kb
        if over_memory or (not self.stop_when_empty and len(self.children) > max(self._target, self.min_workers)):
            newest = max(self.children.values(), key=lambda c: c.started)
            log.info("pool: stopping worker pid=%d (%s)", newest.pid, "memory" if over_memory else "backlog low")
            self._kill(newest.pid, signal.SIGTERM)

    def _fork(self, budget: Budget, *, restart: bool) -> None:
        self._release_connections()
        flush_std_streams()  # nothing buffered may be written twice
        remaining = budget.remaining()
        # A SIGTERM in the child before it has its own handler would stop the parent's budget (the
        # child's copy of it): held back until the child's handler is in place.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            pid = os.fork()
            if pid == 0:
                self._child(None if math.isinf(remaining) else remaining, mask)  # never returns
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.children[pid] = Child(pid, clock.monotonic(), restart)
        self.stats.started += 1
        self.stats.pids.append(pid)
        self.stats.peak = max(self.stats.peak, len(self.children))
        log.info("pool: started worker pid=%d%s (%d running)", pid, " (restart)" if restart else "",
                 len(self.children))

    def _reap(self) -> None:
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if not done:
                continue
            child = self.children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            lived = clock.monotonic() - child.started
            if code == 0:
                if self.stop_when_empty:
                    self._one_ended = True
                    continue
                if self._stopping or lived >= EARLY_EXIT_SECONDS:
                    continue  # stopped for its own limit (--memory, --max-jobs): replaced to the target size
            # A crash; or, without --stop-when-empty, a child that stopped at once (its --memory already
            # passed at start): restarting it without a pause would fork in a loop.
            how = (f"signal {signal.Signals(-code).name}" if code < 0 else
                   f"exit code {code}" if code else f"a stop {lived:.1f}s after its start")
            self.stats.crashed += 1
            now = clock.monotonic()
            self._crash_times = [t for t in self._crash_times if t > now - 60] + [now]
            if self._stopping:
                log.warning("pool: worker pid=%d ended with %s while stopping", pid, how)
                continue
            if len(self._crash_times) > RESTARTS_PER_MINUTE:
                log.error("pool: worker pid=%d ended with %s; %d crashes within a minute: not restarting any "
                          "more, stopping the pool", pid, how, len(self._crash_times))
                self._stopping = "crash-loop"
                continue
            wait = min(BACKOFF_FIRST * 2 ** (len(self._crash_times) - 1), BACKOFF_MAX)
            log.warning("pool: worker pid=%d ended with %s; restarting it in %.1fs (its job comes back when its "
                        "lease ends)", pid, how, wait)
            self._restart_at.append(now + wait)
            self._restart_at.sort()

    def _signal_children(self) -> None:
        self._signalled_children = True
        self._restart_at.clear()
        for pid in list(self.children):
            self._kill(pid, signal.SIGTERM)

    def _kill(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def _collect(self, since) -> None:
        """What the children did, from their own heartbeat rows (one query)."""
        try:
            rows = in_transaction(self.runtime.sessions,
                                  lambda s: heartbeat.runs_of(s, "work", self.stats.pids, since.replace(microsecond=0)))
        except Exception as exc:  # the database is away: the summary says what the parent knows
            log.warning("pool: could not read the workers' heartbeat rows: %s", describe(exc))
            return
        self.stats.jobs_done = sum(r.jobs_done or 0 for r in rows)
        self.stats.jobs_failed = sum(r.jobs_failed or 0 for r in rows)
        self.stats.outcomes = [r.outcome for r in rows]

    # -- a child -------------------------------------------------------------------
    def _child(self, max_time: float | None, mask) -> None:
        code = 1
        try:
            budget = Budget(max_time=max_time, memory_mb=self.memory_kb / 1024 if self.memory_kb else None,
                            max_handled=self.max_jobs, time_headroom=time_headroom(self.runtime.settings))
            for sig in (signal.SIGTERM, signal.SIGINT):  # the parent's handlers stop the parent's budget
                signal.signal(sig, lambda *_: budget.stop("signal"))
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            self._forget_inherited()
            crash_point("worker-start")
            threading.Thread(target=self._watch_parent, args=(budget,), daemon=True, name="cronbox-parent").start()
            # Smaller batches than a lone worker's: a child must not lease the backlog its siblings wait for.
            worker = Worker(self.runtime, self.queues, batch_size=JOBS_PER_WORKER, siblings=True)
            with run_lock_waits(self.runtime.engine, budget.remaining):
                result = record_run(self.runtime.sessions, "work",
                                    lambda: run_loop([worker.run], budget, linger=not self.stop_when_empty,
                                                     poll=self.sleep),
                                    lambda: {"jobs_done": worker.stats.done, "jobs_failed": worker.stats.gave_up})
            s = worker.stats
            log.info("pool worker pid=%d: %d jobs (%d done, %d retried, %d failed, %d deferred); stopped: %s",
                     os.getpid(), s.done + s.retried + s.gave_up + s.lease_lost, s.done, s.retried, s.gave_up,
                     s.deferred, result.stop_reason)
            code = result.exit_code
        except BaseException as exc:
            try:
                log.exception("pool worker pid=%d failed: %s", os.getpid(), describe(exc))
            except BaseException:
                pass
        finally:
            try:
                self.runtime.engine.dispose()
            except BaseException:
                pass
            os._exit(code)

    def _forget_inherited(self) -> None:
        """Everything database-side the parent had stays the parent's: its lock (closed here, never
        released), and the pools of the runtime's engines and the host app's (dropped without
        closing, so nothing is sent on the parent's sockets); this process opens its own connection
        when it first needs one."""
        if self.parent_lock is not None:
            self.parent_lock.abandon()
        self.runtime.host_lock = None
        self.runtime.drop_inherited_connections()

    def _watch_parent(self, budget: Budget) -> None:
        while os.getppid() == self._parent_pid:
            time.sleep(PARENT_POLL)
        log.warning("pool worker pid=%d: the pool's parent pid=%d is gone; stopping after the current job",
                    os.getpid(), self._parent_pid)
        budget.stop("parent-gone")


def _summary_reason(outcomes: list[str]) -> str:
    """The pool's stop reason from its children's: "empty" when they all found the queues empty."""
    distinct = sorted(set(outcomes) - {"running"})
    return ",".join(distinct) if distinct else "empty"


class TickDrain:
    """The tick's worker stage under CRONBOX_TICK_WORKERS > 1: a backlog one worker handles (up to
    JOBS_PER_WORKER due jobs) runs in the tick's own process as before; a larger one by a pool of up to
    `workers` children (--stop-when-empty, the tick's remaining time and --memory), while the tick
    keeps its lock on its own connection and checks it every few seconds."""

    def __init__(self, runtime, worker: Worker, lock: RunLock, workers: int, *, memory_mb: float | None,
                 before_pool: Callable[[], None] | None = None):
        self.runtime, self.worker, self.lock = runtime, worker, lock
        # Called before a pool forks: the tick closes its broker connection there, so no child
        # holds a copy of that socket (a SIGKILLed tick's connection would stay open until its
        # children exit); the relay opens a new one on its next forwarded batch.
        self.before_pool = before_pool
        self.workers = workers
        self.memory_mb = memory_mb
        self.runs = self.restarts = self.jobs_done = self.jobs_failed = self.peak = 0

    def run(self, budget: Budget) -> int:
        if budget.stop_reason() is not None:
            return 0
        due = in_transaction(self.runtime.sessions, lambda s: jobstore.backlog(s, clock.utcnow()))
        if due <= JOBS_PER_WORKER:
            return self.worker.run(budget)
        if self.before_pool is not None:
            self.before_pool()
        pool = Pool(self.runtime, None, min_workers=1, max_workers=self.workers, stop_when_empty=True,
                    memory_mb=self.memory_mb, parent_lock=self.lock, check=self.lock.check)
        pool.run(budget)
        s = pool.stats
        self.runs += 1
        self.restarts += s.restarts
        self.peak = max(self.peak, s.peak)
        self.jobs_done += s.jobs_done
        self.jobs_failed += s.jobs_failed
        return s.jobs_done + s.jobs_failed

    def summary(self) -> str:
        if not self.runs:
            return ""
        return (f"; pool: {self.runs} runs, up to {self.peak} workers, jobs done {self.jobs_done}, "
                f"failed {self.jobs_failed}, restarts {self.restarts}")
