"""The tick: the one cron line users install. Lock, then relay (and later stages), then linger."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import select

from cronbox.cron.scheduling import builtin  # noqa: F401  (registers the built-in tasks)
from cronbox.cron.scheduling.once import CommandRunner, OnceStage, migrate_from_file
from cronbox.cron.scheduling.schedule import Scheduler
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SchemaError, SettingsError
from cronbox.outbox.core.lock_wait import run_lock_waits
from cronbox.outbox.core.notify import Listener
from cronbox.outbox.core.resources import peak_rss_kb
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.admission import time_headroom
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.run_loop import RunResult, record_run, run_loop, start_within
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.events import deliveries
from cronbox.outbox.events.relay import Relay
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.pool import PoolRefused, TickDrain, check_budget, tick_workers
from cronbox.outbox.queue.publisher import JobPublisher
from cronbox.outbox.queue.worker import Worker

log = logging.getLogger("cronbox")

DEFAULT_MAX_TIME = 50.0
DEFAULT_MEMORY_MB = 96.0
LOCK_SLACK = 60  # the lock connection's wait_timeout: above --max-time + 60 s


@dataclass
class TickReport:
    skipped: bool
    result: RunResult | None = None
    relay: Relay | None = None
    worker: Worker | None = None
    scheduler: Scheduler | None = None
    once: OnceStage | None = None
    drain: TickDrain | None = None
    publisher: JobPublisher | None = None
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return 0 if self.skipped or self.result is None else self.result.exit_code

    def summary(self) -> str:
        if self.skipped:
            return "skipped: tick already running"
        r, w = self.relay.stats, self.worker.stats
        line = (f"tick: delivered {r.done}, retried {r.retried}, deferred {r.deferred}, dead {r.gave_up}; "
                f"jobs done {w.done}, retried {w.retried}, deferred {w.deferred}, failed {w.gave_up}; "
                f"tasks {self.scheduler.ran}, one-off runs {self.once.ran} "
                f"in {self.seconds:.2f}s (stopped: {self.result.stop_reason})")
        if self.drain is not None:
            line += self.drain.summary()
        p = self.publisher.stats if self.publisher is not None else None
        if p is not None and (p.published or p.republished or p.failed):
            line += f"; jobs published to the broker {p.published}, again {p.republished}, not confirmed {p.failed}"
        if self.result.error:
            line += f"; error: {self.result.error}"
        return line


def longest_timeout(runtime: Runtime) -> float:
    """The longest any registered consumer, job or scheduled task may run."""
    timeouts = [c.timeout for c in runtime.consumers.all()] + [j.timeout for j in runtime.jobs.all()]
    return max(timeouts + [t.timeout for t in runtime.registry.tasks.all()], default=0.0)


def _check_schema(runtime: Runtime, run_command: CommandRunner) -> None:
    """The schema must match the code; a `migrate` request file may bring it there first."""
    try:
        runtime.ensure_schema()
    except SchemaError:
        if not migrate_from_file(runtime, run_command):
            raise
        runtime.ensure_schema()


def run_tick(runtime: Runtime, *, run_command: CommandRunner, max_time: float = DEFAULT_MAX_TIME,
             linger: bool = True, memory_mb: float | None = DEFAULT_MEMORY_MB) -> TickReport:
    """One tick. `run_command` runs the one-off requests' command lines (`cronbox.cron.cli.main`).
    `memory_mb=None`: no RSS limit (cronbox.testing's tick, inside a test process of any size)."""
    workers = tick_workers(runtime.settings)
    if workers > 1:
        try:  # on MySQL the tick's lock has a connection of its own
            check_budget(runtime.settings, workers, lock_connection=runtime.is_server, what="CRONBOX_TICK_WORKERS")
        except PoolRefused as exc:
            raise SettingsError(str(exc)) from None
    # The lock connection idles while one handler or task runs: its wait_timeout must outlast the
    # longest of them, or the server drops it (and the lock) mid-run.
    lock = runtime.lock("tick", hold_seconds=int(max_time + LOCK_SLACK + longest_timeout(runtime)))
    if not lock.acquire():
        log.info("skipped: tick already running")
        return TickReport(skipped=True)
    started = clock.monotonic()
    relay = publisher = None
    runtime.host_lock = lock  # one-off commands take their locks on its connection (no third connection)
    try:
        budget = Budget(max_time=max_time, memory_mb=memory_mb, time_headroom=time_headroom(runtime.settings))
        blocked = start_within(runtime.engine, budget, lambda: _check_schema(runtime, run_command), "the schema check")
        scheduler, once = Scheduler(runtime), OnceStage(runtime, run_command)
        relay = Relay(runtime, before_batch=lock.check)
        worker = Worker(runtime, before_batch=lock.check)
        publisher = JobPublisher(runtime, before_batch=lock.check)  # forwarded queues' jobs (forward_jobs)

        def close_brokers() -> None:  # a pool's children must not inherit a broker socket
            relay.close()
            publisher.close()

        # CRONBOX_TICK_WORKERS > 1: a backlog larger than one worker's share is drained by a pool.
        drain = (TickDrain(runtime, worker, lock, workers, memory_mb=memory_mb, before_pool=close_brokers)
                 if workers > 1 else None)
        # Scheduled tasks and one-off runs first, then the relay (its consumers often dispatch
        # the jobs the publisher and the worker then take).
        stages = [scheduler.run, once.run, relay.run, publisher.run, drain.run if drain is not None else worker.run]

        def counts() -> dict:
            now = clock.utcnow()
            total = select(deliveries.backlog_count(now) + jobstore.backlog_count(now))  # one statement, not three
            backlog = in_transaction(runtime.sessions, lambda s: s.scalar(total) or 0, retry_waits=False)
            return {"delivered": relay.stats.done, "retried": relay.stats.retried, "dead": relay.stats.gave_up,
                    "jobs_done": worker.stats.done, "jobs_failed": worker.stats.gave_up,
                    "backlog": backlog, "peak_rss_kb": peak_rss_kb()}

        # PostgreSQL: the lingering tick waits on its lock connection for NOTIFY (outbox.core.notify).
        listener = Listener(lambda: lock.connection) if runtime.is_postgresql else None
        if blocked is not None:
            result = blocked
        else:
            with run_lock_waits(runtime.engine, budget.remaining):
                result = record_run(runtime.sessions, "tick",
                                    lambda: run_loop(stages, budget, linger=linger, lock=lock, listener=listener),
                                    counts)
        report = TickReport(skipped=False, result=result, relay=relay, worker=worker, scheduler=scheduler,
                            once=once, drain=drain, publisher=publisher, seconds=clock.monotonic() - started)
        (log.error if result.exit_code else log.info)(report.summary())
        return report
    finally:
        if relay is not None:
            relay.close()  # the broker connection, if the relay forwarded anything
        if publisher is not None:
            publisher.close()
        runtime.host_lock = None
        lock.release()
