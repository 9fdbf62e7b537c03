"""Every statement a run sends waits for a lock no longer than the run's remaining time (issue 24):
another transaction holding the rows a claim needs (MariaDB: FOR UPDATE on the due row, the token
claim's UPDATE waits for it; SQLite: BEGIN IMMEDIATE, which every write waits for) stops the run
by its --max-time, with a log line naming what waited and `stopped: lock-wait`, exit 0, and the
next run goes on once the lock is gone. Before, each claim retried 5 times at the server's default
wait (50 s on MariaDB) and the lock error escaped as a traceback."""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import make_url, select, text

from cronbox import outbox
import cronbox
from cronbox.outbox.engine.models import Heartbeat
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.events.models import Delivery
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from tests.conftest import run_cli, start_cli
from tests.helpers import fan_out, run_seconds

# SKIP LOCKED claims pass locked rows by: nothing waits there. The token claim (old servers) waits.
pytestmark = pytest.mark.backends("sqlite", "mysql-token")

MAX_TIME = 15
# The run's own time (its summary line's "in N s", from when it took its lock or began its budget),
# past --max-time: the last 1 s waits of the run's end, the heartbeat; far below one 50 s wait.
SLACK = 5.5
# The process's time outside its run (the interpreter's start-up and exit), seconds on a loaded
# machine: below one wait at the server's default (50 s), so none can hide there either.
OUTSIDE_RUN = 40


class Blocker:
    """Another transaction holding the lock a run's claim needs, as a host's or a handler's would."""

    def __init__(self, runtime, table: str, row_id: int, whole_table: bool = False):
        self.runtime, self.table, self.row_id, self.whole_table = runtime, table, row_id, whole_table
        self.connection = None

    def __enter__(self):
        if self.whole_table:  # a table lock, which even SKIP LOCKED waits for
            self.connection = self.runtime.engine.connect()
            self.connection.execute(text(f"LOCK TABLE {self.table} IN ACCESS EXCLUSIVE MODE"
                                         if self.runtime.is_postgresql else f"LOCK TABLES {self.table} WRITE"))
        elif self.runtime.is_mysql:
            self.connection = self.runtime.engine.connect()
            self.connection.execute(text(f"SELECT id FROM {self.table} WHERE id = :id FOR UPDATE"), {"id": self.row_id})
        else:
            self.connection = sqlite3.connect(make_url(self.runtime.settings.database_url).database,
                                              isolation_level=None)
            self.connection.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, *exc):
        if self.whole_table and self.runtime.is_mysql:
            self.connection.execute(text("UNLOCK TABLES"))
        self.connection.rollback()
        self.connection.close()


def due_job(runtime) -> int:
    with runtime.sessions.begin() as session:
        job("lockwait", name="lockwait.quiet", registry=Registry())(lambda payload, ctx: None).dispatch(session, {"n": 1})
    with runtime.sessions() as session:
        return session.scalar(select(Job.id))


def due_delivery(runtime, registry) -> int:
    cronbox.consumer("lockwait", name="lockwait.consumer", registry=registry)(lambda event, ctx: None)
    with runtime.sessions.begin() as session:
        cronbox.record(session, "lockwait", {"n": 1})
    fan_out(runtime)
    with runtime.sessions() as session:
        return session.scalar(select(Delivery.id))


def logs(env) -> str:
    folder = Path(env["CRONBOX_INSTANCE"]) / "logs"
    return "\n".join(p.read_text() for p in folder.iterdir()) if folder.exists() else ""


COMMANDS = {
    "tick-job": (("tick", "--max-time", str(MAX_TIME)), "cronbox_jobs", ("tick", "--no-linger")),
    "tick-delivery": (("tick", "--max-time", str(MAX_TIME)), "cronbox_deliveries", ("tick", "--no-linger")),
    "work-job": (("queue", "work", "--queue", "lockwait", "--stop-when-empty", "--max-time", str(MAX_TIME)),
                 "cronbox_jobs", ("queue", "work", "--queue", "lockwait", "--stop-when-empty")),
}


@pytest.mark.parametrize("case", list(COMMANDS))
def test_a_claim_blocked_by_another_transaction_stops_the_run_by_its_time_and_the_next_run_goes_on(
        runtime, registry, env, tmp_path, case):
    blocked_run_stops_and_next_goes_on(runtime, registry, env, tmp_path, case, whole_table=False)


@pytest.mark.backends("mysql-skip-locked")
@pytest.mark.parametrize("case", list(COMMANDS))
def test_a_table_lock_another_session_holds_stops_the_run_by_its_time_too(runtime, registry, env, tmp_path, case):
    """MariaDB's LOCK TABLES ... WRITE: a metadata lock, waited for under lock_wait_timeout (a day by
    default), not innodb_lock_wait_timeout; PostgreSQL's LOCK TABLE ... ACCESS EXCLUSIVE, waited for
    under lock_timeout (no limit by default). SKIP LOCKED passes neither by. The tick's scheduled tasks read the
    locked table too (prune, health): each fails by its bounded wait, then the run stops by its time
    (max-time, or lock-wait if the claim is what was waiting), a few 1 s retries later."""
    blocked_run_stops_and_next_goes_on(runtime, registry, env, tmp_path, case, whole_table=True)


@pytest.mark.backends("postgresql")
def test_a_table_lock_on_postgresql_stops_the_run_by_its_time_too(runtime, registry, env, tmp_path):
    """The same on PostgreSQL, for one command: lock_timeout is set per connection for every statement
    of the run (outbox.core.lock_wait), so the commands differ only in the claim, tested above."""
    blocked_run_stops_and_next_goes_on(runtime, registry, env, tmp_path, "work-job", whole_table=True)


def blocked_run_stops_and_next_goes_on(runtime, registry, env, tmp_path, case: str, *, whole_table: bool):
    command, table, again = COMMANDS[case]
    row_id = due_delivery(runtime, registry) if table == "cronbox_deliveries" else due_job(runtime)
    release = tmp_path / "release"
    release.write_text("go")  # the job itself never waits
    extra = {"CRONBOX_HANDLERS": "tests.handlers.lockwait", "TEST_INSIDE_FILE": str(tmp_path / "inside"),
             "TEST_RELEASE_FILE": str(release)}
    with Blocker(runtime, table, row_id, whole_table):
        started = time.monotonic()
        proc = start_cli(env, *command, **extra)
        out, err = proc.communicate(timeout=MAX_TIME + 120)
        took = time.monotonic() - started
    log = logs(env)
    assert proc.returncode == 0, out + err + log
    assert "Traceback" not in out + err, out + err
    ran = run_seconds(out)
    assert ran < MAX_TIME + (SLACK + 4 if whole_table else SLACK), (ran, out, err, log)
    assert took - ran < OUTSIDE_RUN, (took, ran, out, err)
    if whole_table:
        assert "stopped: lock-wait" in out or "stopped: max-time" in out, out + err
        # cronbox's own line for a claim, or the server's words in a task's error (MariaDB, PostgreSQL)
        assert any(words in log for words in ("waited for a lock another transaction holds",
                                              "Lock wait timeout exceeded", "canceling statement due to lock timeout")), log
    else:
        assert "stopped: lock-wait" in out, out + err
        assert "waited for a lock another transaction holds" in log, log  # said, naming what waited
    with runtime.sessions() as session:
        beat = session.scalars(select(Heartbeat).order_by(Heartbeat.id.desc())).first()
    if runtime.is_mysql and not whole_table:  # SQLite: the database lock keeps the row from being written at all
        assert beat.outcome == "lock-wait", beat.outcome
    done = run_cli(env, *again, **extra)
    assert done.returncode == 0 and "skipped" not in done.stdout, done.stdout + done.stderr
    with runtime.sessions() as session:
        row = session.get(Delivery if table == "cronbox_deliveries" else Job, row_id)
        assert row.status == "done", (row.status, row.last_error)
