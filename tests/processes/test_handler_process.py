"""What a handler does to the process it runs in stays its own (outbox.engine.handler_process):
a forked child that leaves the handler ends there, signal dispositions are put back after every call,
non-daemon threads a handler leaves do not keep a cron process alive past its run."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import make_url, select, text

from cronbox import outbox
import cronbox
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from tests.conftest import child_env, run_cli
from tests.handlers.effects import metadata as effects_metadata
from tests.helpers import reaped, run_seconds, seconds_after_its_run, wait_for
from tests.processes.test_host_cron import host  # noqa: F401  (the fixture)

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")  # the claim mode changes nothing here

# How the child leaves the handler -> the exit code it must end with (tests/handlers/forking.py).
CHILD_CASES = {
    "return": 0, "raise": 1, "system-exit-3": 3, "system-exit-none": 0, "sys-exit-text": 1,
    "keyboard-interrupt": 1, "double-fork": 0, "multiprocessing": 0,
}


def dispatch(session, queue: str, name: str, payload: dict) -> None:
    """A job row for tests.handlers.forking's job `name` (importing that module here would register its
    handlers in every test's default registry)."""
    job(queue, name=name, registry=Registry())(lambda payload, ctx: None).dispatch(session, payload)


def effect_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def logs(env) -> str:
    """What the cron commands of this test logged so far."""
    folder = Path(env["CRONBOX_INSTANCE"]) / "logs"
    return "\n".join(p.read_text() for p in folder.iterdir()) if folder.exists() else ""


@pytest.mark.parametrize("case", list(CHILD_CASES))
def test_a_forked_child_leaving_the_handler_ends_there_and_the_run_goes_on_once(runtime, env, tmp_path, case):
    effects = tmp_path / "effects.txt"
    with runtime.sessions.begin() as session:
        cronbox.record(session, "plain", {"n": 1})
        cronbox.record(session, "fork", {"case": case, "n": 2})
        cronbox.record(session, "plain", {"n": 3})
        cronbox.record(session, "fork-grouped", {"case": case, "n": 4})
        cronbox.record(session, "plain", {"n": 5})
        dispatch(session, "fork", "forking.job", {"case": case, "n": 6})
        dispatch(session, "plain", "forking.plain_job", {"n": 7})
    proc = run_cli(env, "tick", "--no-linger", "--max-time", "60", CRONBOX_HANDLERS="tests.handlers.forking",
                   TEST_EFFECTS_FILE=str(effects), TEST_FORK_TASK=case)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("tick:") == 1, proc.stdout  # one summary: no child ran the tick's loop
    assert "delivered 5, retried 0" in proc.stdout and "jobs done 2," in proc.stdout
    assert "(stopped: empty)" in proc.stdout  # the tick lock was still the parent's at every check
    lines = effect_lines(effects)
    ran = Counter(line for line in lines if line.startswith("ran "))
    assert ran == Counter({"ran forking.plain 1": 1, "ran forking.consumer 2": 1, "ran forking.plain 3": 1,
                           "ran forking.grouped 4": 1, "ran forking.plain 5": 1, "ran forking.job 6": 1,
                           "ran forking.plain_job 7": 1, "ran forking.task 0": 1}), lines
    children = [line for line in lines if line.startswith("child ")]
    assert children == [f"child {case} {CHILD_CASES[case]}"] * 4, lines
    if case == "double-fork":
        assert [line for line in lines if line.startswith("grandchild ")] == ["grandchild 0"] * 4
    if case == "multiprocessing":
        assert sorted(line for line in lines if line.startswith("mp-target ")) == \
            ["mp-target 0", "mp-target 2", "mp-target 4", "mp-target 6"]
    # The parent's connections were left alone: a second tick runs on the same database as usual.
    again = run_cli(env, "tick", "--no-linger", CRONBOX_HANDLERS="tests.handlers.forking",
                    TEST_EFFECTS_FILE=str(effects))
    assert again.returncode == 0 and again.stdout.count("tick:") == 1, again.stdout + again.stderr


# (where the handler runs, the signal it changes, to what): every place once, every change once.
MEDDLING = [("consumer", "SIGTERM", "ignore"), ("grouped", "SIGTERM", "ignore"), ("job", "SIGTERM", "ignore"),
            ("task", "SIGTERM", "ignore"), ("consumer", "SIGTERM", "default"), ("job", "SIGTERM", "own"),
            ("task", "SIGINT", "ignore"), ("grouped", "SIGINT", "default"), ("consumer", "SIGINT", "own")]


@pytest.mark.backends("sqlite")  # what a handler does to its process: the database changes nothing
@pytest.mark.parametrize("where,sig,disposition", MEDDLING)
def test_a_handler_changing_a_stop_signal_does_not_take_the_graceful_stop_away(runtime, env, tmp_path, where, sig,
                                                                               disposition):
    case = f"{sig}:{disposition}"
    inside, release = tmp_path / "inside", tmp_path / "release"
    with runtime.sessions.begin() as session:
        if where == "consumer":
            cronbox.record(session, "meddle", {"case": case})
        if where == "grouped":
            cronbox.record(session, "meddle-grouped", {"case": case})
        if where == "job":
            dispatch(session, "sig", "signals.job", {"case": case})
        dispatch(session, "sig", "signals.block", {})
    extra = {"TEST_SIGNAL_TASK": case} if where == "task" else {}
    proc = subprocess.Popen([sys.executable, "-m", "cronbox", "tick", "--max-time", "20"], cwd="/", text=True,
                            env=child_env(env, CRONBOX_HANDLERS="tests.handlers.signals", TEST_INSIDE_FILE=str(inside),
                                          TEST_RELEASE_FILE=str(release), **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with reaped(proc):
        wait_for(lambda: inside.exists() or proc.poll() is not None, "the blocking job to start")
        assert inside.exists(), "the tick ended before the blocking job started"
        proc.send_signal(getattr(signal, sig))  # the meddler has run: the blocking job comes after it
        # Released once cronbox's handler took the signal (its log line), not a fixed 0.3 s after it was
        # sent, which a loaded machine could pass before the signal was handled.
        wait_for(lambda: f"received {sig}" in logs(env) or proc.poll() is not None, f"the tick to take the {sig}")
        release.write_text("go")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (proc.returncode, out, err)
    # The stop after the current handler, not the run's end at 20 s: the summary says which (a bound on
    # the time after the signal could not tell them apart on a loaded machine).
    assert "(stopped: signal)" in out, out
    assert not Path(str(inside) + ".own").exists()  # the handler's own function was not called for our signal
    log = logs(env)
    assert f"changed the {sig} handler; cronbox's is back in place" in log


@pytest.mark.backends("sqlite")  # what a handler does to its process: the database changes nothing
@pytest.mark.parametrize("linger", [True, False])
def test_non_daemon_threads_a_handler_left_do_not_keep_the_process_past_its_run(runtime, env, linger):
    with runtime.sessions.begin() as session:
        dispatch(session, "threads", "threads.linger", {"n": 1})
    args = ["tick", "--max-time", "6"] + ([] if linger else ["--no-linger"])
    proc = run_cli(env, *args, timeout=90, CRONBOX_HANDLERS="tests.handlers.threads", TEST_THREAD_TASK="1")
    after = seconds_after_its_run(Path(env["CRONBOX_INSTANCE"]) / "logs", "tick", time.time())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert after < 30, after  # ended with its run, not the threads' 60 s later (exit is seconds under load)
    assert proc.stdout.count("tick:") == 1 and "jobs done 1," in proc.stdout, proc.stdout
    assert f"(stopped: {'max-time' if linger else 'empty'})" in proc.stdout
    log = logs(env)
    assert "ending the process with 2 non-daemon thread(s) a handler left running " \
           "(handler-sleeper-1, handler-sleeper-task)" in log, log


def test_a_cron_command_with_no_thread_left_exits_as_usual(env, runtime):
    proc = run_cli(env, "tick", "--no-linger")
    assert proc.returncode == 0 and proc.stdout.count("tick:") == 1
    log = logs(env)
    assert "non-daemon" not in log


@pytest.mark.backends("sqlite")  # what a handler does to its process: the database changes nothing
def test_flask_cron_tick_ends_its_process_by_its_run_too(host):
    """`flask --app clinic cron tick`: the host's flask process is the command's, the same rule applies."""
    proc = host.flask("cron", "tick", "--max-time", "6", TEST_THREAD_TASK="1",
                      CLINIC_CRONBOX_HANDLERS="clinic.handlers,tests.handlers.threads")
    after = seconds_after_its_run(host.root / "instance" / "cronbox" / "logs", "tick", time.time())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert after < 30, after  # ended with its run, not the threads' 60 s later (exit is seconds under load)
    assert proc.stdout.count("tick:") == 1 and "(stopped: max-time)" in proc.stdout, proc.stdout


class RowLock:
    """Another transaction holding a lock the tick's ack needs: on a server the job's row (FOR UPDATE),
    on SQLite the database's write lock (BEGIN IMMEDIATE), as a handler's own connection would."""

    def __init__(self, runtime, job_id: int):
        self.runtime, self.job_id = runtime, job_id
        self.connection = None

    def take(self) -> None:
        if self.runtime.is_server:
            self.connection = self.runtime.engine.connect()
            self.connection.execute(text("SELECT id FROM cronbox_jobs WHERE id = :id FOR UPDATE"), {"id": self.job_id})
        else:
            self.connection = sqlite3.connect(make_url(self.runtime.settings.database_url).database,
                                              isolation_level=None)
            self.connection.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        if self.connection is not None:
            self.connection.rollback()
            self.connection.close()
            self.connection = None


def job_row(runtime, job_id: int):
    with runtime.sessions() as session:
        return session.get(Job, job_id)


# The run's own time past --max-time: its last bounded waits and its end on a loaded machine. A wait
# that ignored the run's time (the ack's 10 s, a server's default 50 s) would go past it.
RUN_SLACK = 8


def start_blocked_tick(runtime, env, tmp_path, name: str, *args: str):
    effects_metadata.create_all(runtime.engine)
    with runtime.sessions.begin() as session:
        dispatch(session, "lockwait", name, {"n": 1})
    with runtime.sessions() as session:
        job_id = session.scalar(select(Job.id))
    inside, release = tmp_path / "inside", tmp_path / "release"
    proc = subprocess.Popen([sys.executable, "-m", "cronbox", "tick", *(args or ("--max-time", "20"))], cwd="/",
                            text=True, env=child_env(env, CRONBOX_HANDLERS="tests.handlers.lockwait",
                                                     TEST_INSIDE_FILE=str(inside), TEST_RELEASE_FILE=str(release)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: inside.exists() or proc.poll() is not None, "the job to start")
    assert inside.exists(), proc.communicate()
    lock = RowLock(runtime, job_id)
    lock.take()
    release.write_text("go")
    return proc, lock, job_id


@pytest.mark.parametrize("name", ["lockwait.quiet", "lockwait.session"])
def test_an_ack_blocked_by_another_transaction_fails_the_attempt_naming_the_lock_wait(runtime, env, tmp_path, name):
    # --max-time 60: room for the waits below however loaded the machine; the run ends once the failed
    # job waits its backoff (600 s), not by its time.
    proc, lock, job_id = start_blocked_tick(runtime, env, tmp_path, name, "--max-time", "60", "--no-linger")
    try:
        if name == "lockwait.session" and not runtime.is_server:
            # A window by nature: SQLite's lock is the whole database's, so nothing of the attempt's
            # failure is written (or logged) while it is held. The handler's own INSERT waits its 10 s
            # and fails; the lock must be gone before the failure's record has waited its 10 s too.
            # 15 s after the release: 5 s of a loaded machine's slack either side.
            time.sleep(15)
        else:  # the ack waited its bounded 10 s and failed the attempt, naming the wait (logged at once)
            wait_for(lambda: "lock wait: the ack waited" in logs(env), "the ack's lock wait to fail the attempt",
                     timeout=120)
    finally:
        lock.release()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    row = job_row(runtime, job_id)
    assert row.status == "ready" and row.attempts == 1, (row.status, row.attempts, row.last_error)
    if name == "lockwait.session" and not runtime.is_server:
        # SQLite: the handler's own write waits for the database lock first, and fails naming it
        assert "database is locked" in row.last_error
        return
    assert row.last_error.startswith("lock wait: the ack waited 10s for a lock held by another transaction "
                                     "(did the handler write cronbox tables on its own connection?)"), row.last_error
    assert "lock wait: the ack waited 10s" in logs(env)  # said when it happened, not only in the row


def test_a_lock_held_past_the_run_ends_the_run_by_its_time_and_the_next_tick_runs(runtime, env, tmp_path):
    proc, lock, job_id = start_blocked_tick(runtime, env, tmp_path, "lockwait.quiet")
    try:
        out, err = proc.communicate(timeout=150)  # the lock is held until the tick has ended
    finally:
        lock.release()
    assert proc.returncode == 0, out + err + logs(env)
    assert run_seconds(out) < 20 + RUN_SLACK, (out, err)  # by its --max-time, not a wait that ignored it
    assert out.count("tick:") == 1 and "(stopped: lock-wait)" in out, out
    again = run_cli(env, "tick", "--no-linger", CRONBOX_HANDLERS="tests.handlers.lockwait")
    assert again.returncode == 0 and "skipped" not in again.stdout, again.stdout + again.stderr
