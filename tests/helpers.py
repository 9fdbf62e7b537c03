"""Small helpers shared by the tests."""
from __future__ import annotations

import re
import subprocess
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import func, select, text

from cronbox.cron.cli import cli
from cronbox.outbox.core import clock
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events import deliveries as delivery_store
from cronbox.outbox.events.models import Delivery, OutboxEvent
from cronbox.outbox.events.relay import Relay


def relay(runtime, *, max_time: float = 30, batch_size: int = 100):
    """One relay run until nothing is due (its broker connection closed after, if it forwarded); its stats."""
    r = Relay(runtime, batch_size=batch_size)
    try:
        r.run(Budget(max_time=max_time, memory_mb=None))
    finally:
        r.close()
    return r.stats


def fan_out(runtime) -> int:
    """Fan out the events not yet fanned out (the relay's first step, without claiming); how many."""
    with runtime.sessions.begin() as session:
        return delivery_store.fan_out(session, runtime.consumers, clock.utcnow(), 500)[0]


def deliveries(runtime, **where) -> list[Delivery]:
    with runtime.sessions() as session:
        query = select(Delivery).order_by(Delivery.id)
        for name, value in where.items():
            query = query.where(getattr(Delivery, name) == value)
        return list(session.scalars(query))


def count_events(runtime) -> int:
    with runtime.sessions() as session:
        return session.scalar(select(func.count()).select_from(OutboxEvent))


def wait_for(condition, what: str, timeout: float = 60, *, pause: float = 0.01) -> None:
    """Poll `condition` every `pause` seconds until it holds; fail naming `what` after `timeout` seconds (a
    bound a loaded machine meets, never a window the test relies on)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(pause)


@contextmanager
def reaped(proc: subprocess.Popen):
    """The block's process is never left running after it: a step that failed (a timeout, an assert)
    kills it and reaps it, so no command outlives its test to hold a lock or a port the next one needs."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def run_until(run, done, *, pause: float, seconds: float = 180) -> None:
    """Clean runs until `done()`: `run()` (which checks its own outcome), then `pause` seconds (the
    leases a killed run held expire meanwhile) and again, as many as a loaded machine needs, bounded
    by `seconds`. Not a fixed number of rounds: each round's share of the work shrinks with the load."""
    deadline = time.monotonic() + seconds
    while True:
        run()
        if done():
            return
        assert time.monotonic() < deadline, f"not done after {seconds:.0f} s of clean runs"
        time.sleep(pause)


def run_seconds(output: str) -> float:
    """A run's own time: its summary line's "in N s" (tick, queue work; from when it took its lock or
    began its budget). Bounds on a command's run use it, not the process's wall time, which counts the
    interpreter's start-up and exit: seconds on a loaded machine."""
    match = re.search(r" in (\d+\.\d+)s", output)
    assert match, f"no run summary in: {output[-3000:]}"
    return float(match.group(1))


def seconds_after_its_run(logs: Path, command: str, exited_at: float) -> float:
    """How long a command's process lived after its run: from the run's summary line in the log
    folder `logs` ("tick: ..." for command "tick", cronbox's own timestamp) to `exited_at` (time.time()
    once the process had exited). A bound on the whole process would count the interpreter's
    start-up, seconds on a loaded machine, which is not what such tests check."""
    lines = [line for path in sorted(logs.glob("cronbox-*.log")) for line in path.read_text().splitlines()
             if f"] {command}: " in line]
    assert lines, f"no {command} summary in {logs}"
    stamp = datetime.strptime(lines[-1].split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    return exited_at - stamp.timestamp()


def invoke(env: dict, *args: str):
    """Run a cron command in-process (shares clock.frozen with the test)."""
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result


def cronbox_log(runtime) -> str:
    """What cronbox's processes with this runtime's settings logged (their daily files)."""
    return "".join(p.read_text() for p in sorted(runtime.settings.logs_dir.glob("cronbox-*.log")))


def table_column(output: str, header: str) -> list[str]:
    """One column of a command's table (`queue failed`, `outbox dead`: cron.format.table), a cell per
    row. Its cells are right-aligned under the header, so each ends where the header does; for
    columns whose cells have no spaces (ids, counts)."""
    lines = output.splitlines()
    start = next(n for n, line in enumerate(lines) if header in line.split())
    end = lines[start].index(header) + len(header)
    return [line[:end].split()[-1] for line in lines[start + 1:] if line.strip() and not line.startswith("more:")]


def kill_connection(admin_engine, thread_id: int, timeout: float = 60.0) -> None:
    """KILL a MariaDB connection and wait until the server has ended it. KILL only marks the thread:
    it lets go of its named locks and leaves the process list a moment later, so a test that looks
    right after KILL can still see the lock held (a CI failure once)."""
    with admin_engine.connect() as connection:
        connection.execute(text(f"KILL {int(thread_id)}"))
        deadline = time.monotonic() + timeout
        while connection.execute(text("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = :id"),
                                 {"id": int(thread_id)}).scalar():
            assert time.monotonic() < deadline, f"connection {thread_id} still there {timeout} s after KILL"
            time.sleep(0.02)


def opened_payload(runtime, row) -> str:
    """A job row's payload as JSON text, opened when it is sealed (the channel jobs are)."""
    import json

    from cronbox.outbox.core.sealing import JOBS, open_payload

    return json.dumps(open_payload(runtime, JOBS, row.handler, row.seal_id, row.payload), ensure_ascii=False)
