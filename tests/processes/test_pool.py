"""The worker pool (`queue work --workers N`, CRONBOX_TICK_WORKERS): real forked processes, signals, kills."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from cronbox.outbox.core.locks import lock_name
from cronbox.outbox.engine.models import Heartbeat
from cronbox.outbox.queue import pool
from cronbox.outbox.queue.models import Job
from tests.conftest import BACKENDS, MYSQL_BACKENDS, ONE_MYSQL_MODE, child_env, run_cli
from tests.handlers import pool_jobs
from tests.helpers import cronbox_log, wait_for

# MariaDB once: the claim mode matters only where children claim side by side (both modes there).
pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)

HANDLERS = "tests.handlers.pool_jobs"


@pytest.fixture
def pool_env(env, runtime, tmp_path):
    pool_jobs.metadata.create_all(runtime.engine)
    inside = tmp_path / "inside"
    inside.mkdir()
    return {**env, "CRONBOX_HANDLERS": HANDLERS, "TEST_INSIDE_DIR": str(inside),
            "TEST_RELEASE_FILE": str(tmp_path / "release")}


def dispatch(runtime, handler, numbers) -> None:
    with runtime.sessions.begin() as session:
        for n in numbers:
            handler.dispatch(session, {"n": n})


def done_rows(runtime):
    with runtime.sessions() as session:
        return session.execute(select(pool_jobs.done).order_by(pool_jobs.done.c.n)).all()


def jobs(runtime) -> list[Job]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def unfinished(runtime) -> int:
    with runtime.sessions() as session:
        return session.scalar(select(func.count()).select_from(Job).where(Job.status != "done"))


def work_rows(runtime, command: str = "work") -> list[Heartbeat]:
    with runtime.sessions() as session:
        return list(session.scalars(select(Heartbeat).where(Heartbeat.command == command).order_by(Heartbeat.id)))


def start_pool(env, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cronbox", "queue", "work", *args], env=child_env(env), cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def inside(pool_env, n: int) -> tuple[int, int] | None:
    path = Path(pool_env["TEST_INSIDE_DIR"], f"hold-{n}")
    if not path.exists() or not path.read_text():
        return None
    pid, attempt = path.read_text().split()
    return int(pid), int(attempt)


@pytest.mark.backends(*BACKENDS)
def test_three_workers_drain_every_job_exactly_once(runtime, pool_env):
    dispatch(runtime, pool_jobs.insert_once.job, range(300))
    proc = start_pool({**pool_env, "TEST_SLEEP": "0.003"}, "--workers", "3", "--stop-when-empty")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "pool of workers 3" in out and "started 3, restarts 0, jobs 300 done, 0 failed" in out, out
    assert "stopped: empty" in out and "Traceback" not in err
    rows = done_rows(runtime)
    assert [r.n for r in rows] == list(range(300))  # each once: the key is unique, no insert failed
    assert unfinished(runtime) == 0  # (a job may have run twice if its lease ran out: committed once)
    children = {r.pid for r in work_rows(runtime)}
    assert len(children) == 3 and proc.pid not in children  # every child wrote its own heartbeat row
    assert {r.pid for r in rows} <= children and len({r.pid for r in rows}) >= 2  # the work was shared
    [pool] = work_rows(runtime, "pool")
    assert pool.pid == proc.pid and pool.outcome == "empty" and "workers 3" in pool.detail
    status = run_cli(pool_env, "queue", "status")
    assert "last pool" in status.stdout and "restarts 0" in status.stdout, status.stdout


@pytest.mark.backends(*BACKENDS)
def test_a_child_killed_mid_job_is_replaced_and_its_job_recovered_by_lease(runtime, pool_env):
    proc = start_pool(pool_env, "--workers", "3", "--max-time", "40", "--sleep", "0.1")
    wait_for(lambda: len(children_of(proc.pid)) == 3, "three children")
    dispatch(runtime, pool_jobs.hold.job, [0])
    wait_for(lambda: inside(pool_env, 0) is not None, "the job to start")
    holder, attempt = inside(pool_env, 0)
    assert attempt == 1 and holder in children_of(proc.pid)
    dispatch(runtime, pool_jobs.insert_once.job, range(1, 41))
    os.kill(holder, signal.SIGKILL)  # mid-job: it waits for the release file
    Path(pool_env["TEST_RELEASE_FILE"]).write_text("go")
    wait_for(lambda: unfinished(runtime) == 0, "every job to be done")
    wait_for(lambda: len(children_of(proc.pid)) == 3, "the replacement child")
    assert holder not in children_of(proc.pid)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "started 4, restarts 1" in out and "stopped: signal" in out, out
    assert [r.n for r in done_rows(runtime)] == list(range(41))  # nothing lost, nothing twice
    [held] = [j for j in jobs(runtime) if j.handler == "pool.hold"]
    assert held.status == "done" and held.attempts == 2  # the lease ran out; another child ran it
    assert inside(pool_env, 0)[0] != holder
    logs = "".join(p.read_text() for p in runtime.settings.logs_dir.glob("cronbox-*.log"))
    assert f"worker pid={holder} ended with signal SIGKILL; restarting it" in logs


def test_sigterm_to_the_parent_lets_every_child_finish_its_job(runtime, pool_env):
    proc = start_pool(pool_env, "--workers", "3", "--max-time", "60", "--sleep", "0.1")
    wait_for(lambda: len(children_of(proc.pid)) == 3, "three children")
    children = children_of(proc.pid)
    for n in range(3):  # one at a time, so each lands on a different idle child
        # hold_long: in its job until released (55 s at most), however long a loaded machine takes to
        # start the others (pool.hold's 3.5 s could end the first job on its own)
        dispatch(runtime, pool_jobs.hold_long.job, [n])
        wait_for(lambda: inside(pool_env, n) is not None, f"job {n} to start")
    assert {inside(pool_env, n)[0] for n in range(3)} == children
    proc.send_signal(signal.SIGTERM)
    # Once the parent took the signal (its log says so), not a fixed 0.3 s after it was sent, which a
    # loaded machine could pass before the signal was handled: then nothing would be checked.
    wait_for(lambda: "received SIGTERM" in cronbox_log(runtime), "the pool to take the SIGTERM")
    assert proc.poll() is None and all(alive(pid) for pid in children)  # each still in its job
    Path(pool_env["TEST_RELEASE_FILE"]).write_text("go")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "restarts 0, jobs 3 done" in out and "stopped: signal" in out, out
    assert not any(alive(pid) for pid in children)
    assert [r.n for r in done_rows(runtime)] == [0, 1, 2]
    assert all(j.status == "done" and j.attempts == 1 for j in jobs(runtime))
    assert sorted(r.outcome for r in work_rows(runtime)) == ["signal"] * 3


def test_children_stop_when_the_parent_is_sigkilled(runtime, pool_env):
    proc = start_pool(pool_env, "--workers", "2", "--max-time", "60", "--sleep", "0.1")
    wait_for(lambda: len(children_of(proc.pid)) == 2, "two children")
    children = children_of(proc.pid)
    dispatch(runtime, pool_jobs.hold_long.job, [0])  # in its job until released, however loaded the machine
    wait_for(lambda: inside(pool_env, 0) is not None, "the job to start")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)  # (its children still have its stdout)
    # The idle child's exit shows the children saw their parent gone (each looks every PARENT_POLL): a
    # fixed 2 x PARENT_POLL could pass on a loaded machine before either looked, and check nothing.
    busy = inside(pool_env, 0)[0]
    wait_for(lambda: not any(alive(pid) for pid in children - {busy}), "the idle child to see its parent gone")
    assert alive(busy)  # the one in the job finishes it first
    Path(pool_env["TEST_RELEASE_FILE"]).write_text("go")
    wait_for(lambda: not any(alive(pid) for pid in children), "the orphaned children to exit")
    assert [r.n for r in done_rows(runtime)] == [0]  # the job in progress was finished, not abandoned
    assert sorted(r.outcome for r in work_rows(runtime)) == ["parent-gone"] * 2


@pytest.mark.parametrize("args, budget", [(["--workers", "5"], None), (["--max-workers", "3"], "3"),
                                          (["--workers", "2"], "2")])
def test_a_pool_over_the_connection_budget_is_a_usage_error(runtime, pool_env, args, budget):
    extra = {"CRONBOX_MAX_CONNECTIONS": budget} if budget else {}
    proc = run_cli(pool_env, "queue", "work", "--stop-when-empty", *args, **extra)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "CRONBOX_MAX_CONNECTIONS" in line and "needs" in line
    assert work_rows(runtime) == [] and work_rows(runtime, "pool") == []  # nothing was forked


@pytest.mark.backends("sqlite")  # how the pool supervises its children: the database changes nothing
def test_bad_pool_options_are_usage_errors(pool_env):
    for args in (["--workers", "2", "--max-workers", "3"], ["--min-workers", "3", "--max-workers", "2"],
                 ["--workers", "2", "--once"], ["--workers", "0"]):
        proc = run_cli(pool_env, "queue", "work", "--stop-when-empty", *args)
        assert proc.returncode == 2, (args, proc.stdout + proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.backends("sqlite")  # how the pool supervises its children: the database changes nothing
def test_children_that_crash_at_start_are_restarted_with_a_backoff_not_in_a_loop(runtime, pool_env):
    dispatch(runtime, pool_jobs.insert_once.job, range(5))
    started = time.monotonic()
    proc = run_cli(pool_env, "queue", "work", "--workers", "3", "--max-time", "6",
                   CRONBOX_CRASH_AT="worker-start")
    # The parent ends with its --max-time however often its children crash (a loaded machine adds its
    # start-up and exit to the 6 s: the bound tells apart only a pool that never stops).
    assert time.monotonic() - started < 120
    out = proc.stdout
    restarts = int(out.split("restarts ")[1].split(",")[0])
    assert 3 <= restarts <= 10, out  # replaced, but with growing waits: a handful in 6 s, not hundreds
    assert done_rows(runtime) == []


@pytest.mark.backends("sqlite")  # how the pool supervises its children: the database changes nothing
def test_a_child_that_stops_at_once_for_memory_is_not_restarted_in_a_loop(runtime, pool_env):
    started = time.monotonic()
    proc = run_cli(pool_env, "queue", "work", "--workers", "2", "--memory", "8", "--max-time", "5")
    # By its --max-time (a loaded machine adds its start-up and exit): the bound tells apart only a pool
    # that never stops.
    assert proc.returncode == 0 and time.monotonic() - started < 120, proc.stdout + proc.stderr
    restarts = int(proc.stdout.split("restarts ")[1].split(",")[0])
    assert 1 <= restarts <= 6, proc.stdout  # each worker passes 8 MB at once: waits grow between restarts
    assert {r.outcome for r in work_rows(runtime)} == {"memory"}


def test_min_and_max_workers_scale_with_the_backlog(runtime, pool_env):
    dispatch(runtime, pool_jobs.insert_once.job, range(100))  # 5 workers' worth of due jobs
    proc = run_cli({**pool_env, "TEST_SLEEP": "0.02"}, "queue", "work", "--min-workers", "1",
                   "--max-workers", "3", "--stop-when-empty")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pool of workers 1-3 (peak 3), started 3" in proc.stdout, proc.stdout
    assert [r.n for r in done_rows(runtime)] == list(range(100))
    proc = run_cli(pool_env, "queue", "work", "--min-workers", "1", "--max-workers", "3", "--stop-when-empty")
    assert "pool of workers 1-3 (peak 1), started 1" in proc.stdout, proc.stdout  # nothing due: one


def test_the_memory_limit_keeps_the_pool_small(runtime, pool_env):
    dispatch(runtime, pool_jobs.insert_once.job, range(20))
    # Less than two processes' RSS (a worker: ~50-60 MiB, PostgreSQL's driver the largest), more than one's:
    # the first child starts (a lone worker always may) and finishes the queue, no second one starts.
    proc = run_cli(pool_env, "queue", "work", "--workers", "3", "--memory", "75", "--stop-when-empty")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(peak 1), started 1" in proc.stdout, proc.stdout
    assert [r.n for r in done_rows(runtime)] == list(range(20))
    logs = "".join(p.read_text() for p in runtime.settings.logs_dir.glob("cronbox-*.log"))
    assert "not starting another worker" in logs


def test_the_tick_drains_with_a_pool_and_keeps_its_lock(runtime, pool_env, backend):
    dispatch(runtime, pool_jobs.insert_once.job, range(90))
    proc = run_cli({**pool_env, "TEST_SLEEP": "0.01"}, "tick", "--no-linger", "--memory", "512",
                   CRONBOX_TICK_WORKERS="3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "; pool: 1 runs, up to 3 workers, jobs done 90" in proc.stdout, proc.stdout
    rows = done_rows(runtime)
    assert [r.n for r in rows] == list(range(90)) and len({r.pid for r in rows}) >= 2
    if backend.startswith("mysql"):
        holders = {r.lock_holder for r in rows}
        assert len(holders) == 1 and None not in holders  # the tick held its lock throughout...
        assert not holders & {r.connection_id for r in rows}  # ...on a connection no child used
        with runtime.engine.connect() as connection:
            name = lock_name(runtime.engine.url.database, "tick")
            assert connection.execute(text("SELECT IS_FREE_LOCK(:n)"), {"n": name}).scalar() == 1


def test_tick_workers_over_the_budget_is_refused(pool_env, backend):
    workers = "3" if backend != "sqlite" else "4"  # the lock's connection counts on a server only
    assert run_cli(pool_env, "tick", "--no-linger", CRONBOX_TICK_WORKERS=workers).returncode == 0
    proc = run_cli(pool_env, "tick", "--no-linger", CRONBOX_TICK_WORKERS=str(int(workers) + 1))
    assert proc.returncode == 1 and "CRONBOX_MAX_CONNECTIONS" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.backends(*MYSQL_BACKENDS)
def test_children_never_use_the_ticks_lock_connection(runtime, pool_env, mysql_admin, database):
    """While a tick's pool runs: the lock is held by one connection, the children's are others, and the
    pool stays within its connection budget; when the tick's process is SIGKILLed, its lock goes with it
    even though its children still finish their jobs."""
    for first in (0, 20, 40):  # each child's first batch (20 jobs) starts with a job that holds it
        dispatch(runtime, pool_jobs.hold_long.job, [first])
        dispatch(runtime, pool_jobs.insert_once.job, range(first + 1, first + 20))
    tick = subprocess.Popen([sys.executable, "-m", "cronbox", "tick", "--no-linger", "--memory", "512"],
                            env=child_env({**pool_env, "CRONBOX_TICK_WORKERS": "3"}), cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    name = lock_name(database.name, "tick")
    wait_for(lambda: all(inside(pool_env, n) is not None for n in (0, 20, 40)), "the pool's children in their jobs")
    children = children_of(tick.pid)
    assert len(children) == 3
    with mysql_admin.connect() as connection:
        holder = connection.execute(text("SELECT IS_USED_LOCK(:n)"), {"n": name}).scalar()
        ids = set(connection.execute(text("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = :db"),
                                     {"db": database.name}).scalars())
    assert holder is not None and holder in ids
    assert len(ids - {holder}) <= 4  # 3 children + the parent's short-lived connection at most
    tick.send_signal(signal.SIGKILL)
    tick.wait(timeout=60)  # (its children still have its stdout)
    with mysql_admin.connect() as connection:  # the children still hold the socket's twin no longer
        # Free while the children are still in their jobs (held until released, 55 s at most): 30 s
        # tells the lock dying with the parent from the children's holding it, however loaded.
        wait_for(lambda: connection.execute(text("SELECT IS_FREE_LOCK(:n)"), {"n": name}).scalar() == 1,
                 "the killed tick's lock to be free", timeout=30)
    assert all(alive(pid) for pid in children)  # still in their jobs: the lock died with the parent alone
    Path(pool_env["TEST_RELEASE_FILE"]).write_text("go")
    wait_for(lambda: not any(alive(pid) for pid in children), "the orphaned children to exit")
    out, err = tick.communicate(timeout=60)
    assert "Traceback" not in err and "Exception" not in err, err
    rows = done_rows(runtime)
    assert {0, 20, 40} <= {r.n for r in rows}  # the jobs they were in were finished
    assert holder not in {r.connection_id for r in rows}


def test_a_malformed_connection_budget_is_one_line(pool_env):
    for value in ("many", "0"):
        proc = run_cli(pool_env, "queue", "work", "--stop-when-empty", "--workers", "2", CRONBOX_MAX_CONNECTIONS=value)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "CRONBOX_MAX_CONNECTIONS" in proc.stderr


def _broker_connections(vhost: str) -> int:
    from tests.rabbit import rabbitmqctl
    rows = rabbitmqctl("list_connections", "-q", "--no-table-headers", "vhost", "client_properties")
    return sum(1 for line in rows.splitlines() if line.startswith(vhost + "\t") and "cronbox relay" in line)


@pytest.mark.backends("sqlite", "mysql-skip-locked")
def test_the_ticks_broker_connection_is_closed_before_its_pool_forks(runtime, pool_env, rabbit):
    """A tick that forwarded events and then drains a backlog with a pool closes its broker
    connection first: no child holds a copy of that socket (a SIGKILLed tick's connection would stay
    open at the broker until its children finished); the relay opens a new one when it needs it."""
    from tests.processes.test_forward_processes import check_arrivals, record
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "fwd.#")
    recorded = record(runtime, 3)
    for first in (0, 20):  # each child's first batch starts with a job that holds it
        dispatch(runtime, pool_jobs.hold_long.job, [first])
        dispatch(runtime, pool_jobs.insert_once.job, range(first + 1, first + 20))
    env = {**pool_env, "CRONBOX_HANDLERS": f"{HANDLERS},tests.handlers.forwarding", "TEST_AMQP_EXCHANGE": exchange,
           "CRONBOX_AMQP_URL": rabbit.url, "CRONBOX_TICK_WORKERS": "2"}
    tick = subprocess.Popen([sys.executable, "-m", "cronbox", "tick", "--no-linger", "--memory", "512"],
                            env=child_env(env), cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: inside(pool_env, 0) is not None, "a pool child in its job")
        assert children_of(tick.pid)
        assert _broker_connections(rabbit.vhost) == 0  # closed before the fork, not copied into the children
    finally:
        Path(pool_env["TEST_RELEASE_FILE"]).write_text("go")
        out, err = tick.communicate(timeout=60)
    assert tick.returncode == 0, out + err
    check_arrivals(rabbit.take(queue), recorded)  # the events went out before the pool ran
    assert [r.n for r in done_rows(runtime)] == list(range(40))


@pytest.mark.backends("sqlite")  # how the pool supervises its children: the database changes nothing
def test_workers_that_keep_crashing_stop_the_pool_as_a_crash_loop(runtime, pool_env):
    """Past RESTARTS_PER_MINUTE crashes within a minute the pool stops restarting: exit 1, one line
    that says so, its heartbeat row "crash-loop" with the error, well before --max-time."""
    dispatch(runtime, pool_jobs.insert_once.job, range(3))
    started = time.monotonic()
    proc = run_cli(pool_env, "queue", "work", "--workers", "4", "--max-time", "300",
                   CRONBOX_CRASH_AT="worker-start", timeout=200)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert time.monotonic() - started < 150  # stopped by the crash loop, not by --max-time
    restarts = int(proc.stdout.split("restarts ")[1].split(",")[0])
    assert restarts <= pool.RESTARTS_PER_MINUTE, proc.stdout  # never forking in a loop
    pools = work_rows(runtime, "pool")
    assert [(p.outcome, p.error) for p in pools] == [("crash-loop", "workers kept crashing: see the cronbox log")]
    assert done_rows(runtime) == []
    assert {j.status for j in jobs(runtime)} == {"ready"}  # nothing claimed by a child that died at start


def _flock_free(path: Path) -> bool:
    """Could another process take the flock on `path` now?"""
    import fcntl
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # (closing the descriptor also unlocks)
    return True


@pytest.mark.backends("sqlite")
def test_a_sigkilled_ticks_file_lock_goes_with_it_while_its_children_run(runtime, pool_env, settings):
    """SQLite: the tick's run lock is an flock on a file; its forked children hold no copy of that
    file's descriptor (filelock closes it in a child after the fork, without unlocking), so when the
    tick is SIGKILLed its lock goes with it, though its children still finish their jobs."""
    for first in (0, 20):  # each child's first batch (20 jobs) starts with a job that holds it
        dispatch(runtime, pool_jobs.hold_long.job, [first])
        dispatch(runtime, pool_jobs.insert_once.job, range(first + 1, first + 20))
    tick = subprocess.Popen([sys.executable, "-m", "cronbox", "tick", "--no-linger", "--memory", "512"],
                            env=child_env({**pool_env, "CRONBOX_TICK_WORKERS": "2"}), cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock_file = settings.locks_dir / "tick.lock"
    try:
        wait_for(lambda: all(inside(pool_env, n) is not None for n in (0, 20)), "the pool's children in their jobs")
        children = children_of(tick.pid)
        assert len(children) == 2
        assert not _flock_free(lock_file)  # the tick's
        tick.send_signal(signal.SIGKILL)
        tick.wait(timeout=60)
        # Free while the children are still in their jobs (held until released, 55 s at most): 30 s
        # tells the lock dying with the parent from the children's holding it, however loaded.
        wait_for(lambda: _flock_free(lock_file), "the killed tick's lock to be free", timeout=30)
        assert all(alive(pid) for pid in children)  # still in their jobs: the lock died with the parent alone
    finally:
        Path(pool_env["TEST_RELEASE_FILE"]).write_text("go")
    wait_for(lambda: not any(alive(pid) for pid in children), "the orphaned children to exit")
    tick.communicate(timeout=60)
    assert {0, 20} <= {r.n for r in done_rows(runtime)}  # the jobs they were in were finished
