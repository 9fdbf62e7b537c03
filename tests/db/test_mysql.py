"""What only a real MariaDB server can show: open transactions, killed lock connections,
a short wait_timeout, the connection limit, lock-wait retries."""
from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from cronbox import outbox
import cronbox
from cronbox.outbox.core.engines import make_engine
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.core import clock
from cronbox.outbox.core.locks import CONFIRMED_FOR, lock_name
from cronbox.outbox.events.consumers import consumer
from tests.conftest import MYSQL_BACKENDS, child_env, run_cli
from tests.handlers.effects import metadata as effects_metadata
from tests.helpers import deliveries, kill_connection, relay, wait_for
from tests.processes.test_tick import HANDLERS, heartbeats, record

pytestmark = pytest.mark.backends(*MYSQL_BACKENDS)


def test_event_committed_late_is_delivered_and_the_open_transaction_never_blocks_the_relay(runtime, registry,
                                                                                          settings):
    seen = []
    consumer("gap", name="gap", registry=registry)(lambda event, ctx: seen.append(event.payload["n"]))
    other = make_engine(settings, role="web")
    open_request = sessionmaker(other)()
    try:
        first = cronbox.record(open_request, "gap", {"n": 1})
        open_request.flush()  # id given, row locked, not committed: a gap for everyone else
        with runtime.sessions.begin() as session:
            second = cronbox.record(session, "gap", {"n": 2})
        assert second.id > first.id

        finished = threading.Event()
        worker = threading.Thread(target=lambda: (relay(runtime), finished.set()))
        started = time.monotonic()
        worker.start()
        worker.join(timeout=60)
        assert finished.is_set(), "the relay waited on the open transaction's locks"
        # Not blocked: a relay that waited for the gap's row lock would end by its 30 s run time at
        # the soonest (each wait is bounded by the run's time left).
        assert time.monotonic() - started < 15
        assert seen == [2]

        open_request.commit()
        relay(runtime)
        assert seen == [2, 1]  # no "last id seen" cursor skipped the gap
    finally:
        open_request.close()
        other.dispose()


def _lock_holder(admin, database: str) -> int | None:
    with admin.connect() as connection:
        return connection.execute(text("SELECT IS_USED_LOCK(:n)"), {"n": lock_name(database, "tick")}).scalar()


def test_a_run_lock_counts_as_held_for_half_a_second_after_the_server_last_said_so(runtime, mysql_admin, database,
                                                                                    monkeypatch):
    """The run loop and each stage check the lock in turn: within CONFIRMED_FOR of GET_LOCK or of the
    last IS_USED_LOCK it counts as held; past it the server is asked, and a lock whose connection was
    killed meanwhile is found lost then, and taken again on a new connection."""
    now = [1000.0]
    monkeypatch.setattr(clock, "monotonic", lambda: now[0])
    lock = runtime.lock("probe")
    name = lock_name(database.name, "probe")

    def kill_holder() -> int:
        holder = int(lock.connection.connection.dbapi_connection.thread_id())
        kill_connection(mysql_admin, holder)
        with mysql_admin.connect() as connection:
            assert connection.execute(text("SELECT IS_USED_LOCK(:n)"), {"n": name}).scalar() is None
        return holder

    try:
        assert lock.acquire()
        killed = kill_holder()
        now[0] += CONFIRMED_FOR - 0.1
        assert lock.backend.held()  # within the window from GET_LOCK: not asked
        now[0] += 0.2
        assert lock.ensure()  # past it: asked, found lost, taken again
        holder = int(lock.connection.connection.dbapi_connection.thread_id())
        assert holder != killed
        with mysql_admin.connect() as connection:
            assert connection.execute(text("SELECT IS_USED_LOCK(:n)"), {"n": name}).scalar() == holder
        now[0] += CONFIRMED_FOR + 0.1
        assert lock.backend.held()  # asked, and confirmed: the window starts again here
        kill_holder()
        now[0] += CONFIRMED_FOR - 0.1
        assert lock.backend.held()
        now[0] += 0.2
        assert not lock.backend.held()  # asked: lost
        assert lock.ensure() and lock.backend.held()
    finally:
        lock.release()


@pytest.fixture
def tick_env(env, runtime):
    effects_metadata.create_all(runtime.engine)
    return {**env, "CRONBOX_HANDLERS": HANDLERS}


def _start_tick(tick_env, *args):
    return subprocess.Popen([sys.executable, "-m", "cronbox", "tick", *args], env=child_env(tick_env), cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_lock_connection_is_retaken(runtime, tick_env, mysql_admin, database):
    # --max-time: room on a loaded machine for the kill, the re-take and a delivery after them.
    proc = _start_tick(tick_env, "--max-time", "20")
    wait_for(lambda: _lock_holder(mysql_admin, database.name) is not None, "the tick to take its lock")
    holder = _lock_holder(mysql_admin, database.name)
    kill_connection(mysql_admin, holder)
    wait_for(lambda: _lock_holder(mysql_admin, database.name) not in (None, holder), "the lock to be re-taken", 30)
    record(runtime, "ping", 1)  # and the tick still works
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, out + err
    assert "delivered 1" in out
    log = (runtime.settings.logs_dir).glob("cronbox-*.log")
    assert any("re-taken" in path.read_text() for path in log)


def test_killed_lock_connection_taken_by_another_stops_the_tick(runtime, tick_env, mysql_admin, database):
    proc = _start_tick(tick_env, "--max-time", "20")
    wait_for(lambda: _lock_holder(mysql_admin, database.name) is not None, "the tick to take its lock")
    holder = _lock_holder(mysql_admin, database.name)
    with mysql_admin.connect() as thief:
        thief.execute(text(f"KILL {int(holder)}"))  # GET_LOCK below waits the moment KILL takes
        got = thief.execute(text("SELECT GET_LOCK(:n, 5)"), {"n": lock_name(database.name, "tick")}).scalar()
        assert got == 1
        out, err = proc.communicate(timeout=30)
        thief.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": lock_name(database.name, "tick")})
    assert proc.returncode == 1
    assert "stopped: lock-lost" in out and "lost (connection killed or server restarted)" in out
    logs = "".join(path.read_text() for path in runtime.settings.logs_dir.glob("cronbox-*.log"))
    assert "is lost and could not be re-taken" in logs
    [beat] = heartbeats(runtime)
    assert beat.outcome == "lock-lost"


@pytest.fixture
def short_wait_timeout(mysql_admin, database, server_settings_lock):
    server_settings_lock.exclusive()  # no other test's connection may meet this setting
    with mysql_admin.connect() as connection:
        previous = connection.execute(text("SELECT @@GLOBAL.wait_timeout")).scalar()
        connection.execute(text("SET GLOBAL wait_timeout = 2"))
    try:
        yield
    finally:
        with mysql_admin.connect() as connection:
            connection.execute(text(f"SET GLOBAL wait_timeout = {int(previous)}"))
        server_settings_lock.shared()


@pytest.fixture
def limited_user(mysql_admin, database):
    """A MySQL user allowed 2 connections at once, like a shared host's max_user_connections."""
    user, password = f"cbx_{secrets.token_hex(4)}", secrets.token_hex(8)
    with mysql_admin.connect() as connection:
        connection.execute(text(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}' WITH MAX_USER_CONNECTIONS 2"))
        connection.execute(text(f"GRANT ALL ON {database.name}.* TO '{user}'@'%'"))
    url = make_url(database.url).set(username=user, password=password).render_as_string(hide_password=False)
    try:
        yield user, url
    finally:
        with mysql_admin.connect() as connection:
            connection.execute(text(f"DROP USER '{user}'@'%'"))


def test_lingering_tick_keeps_its_lock_under_a_short_wait_timeout_with_two_connections(
        runtime, tick_env, mysql_admin, database, short_wait_timeout, limited_user):
    """The server drops a connection idle for 2 s (wait_timeout) and takes its lock with it. The tick
    lingers three times that long after taking its lock (its connections idle between polls), keeps
    the lock on the same connection, then delivers an event recorded meanwhile, while a second tick is
    skipped. Each step waits for the one before (the lock taken, the event delivered), so a loaded
    machine's slow start-up moves them but never reorders them; --max-time leaves room for them all."""
    user, url = limited_user
    seen_connections = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            with mysql_admin.connect() as connection:
                seen_connections.append(connection.execute(
                    text("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = :u"), {"u": user}).scalar())
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    proc = _start_tick({**tick_env, "DATABASE_URL": url}, "--max-time", "30")
    try:
        wait_for(lambda: _lock_holder(mysql_admin, database.name) is not None, "the tick to take its lock")
        holder, taken = _lock_holder(mysql_admin, database.name), time.monotonic()
        wait_for(lambda: time.monotonic() - taken >= 3 * 2, "the tick to linger past three wait_timeouts")
        assert _lock_holder(mysql_admin, database.name) == holder  # never dropped by the server
        record(runtime, "ping", 1)  # recorded while the tick lingers, connections idle between polls
        wait_for(lambda: [d.status for d in deliveries(runtime)] == ["done"], "the lingering tick to deliver it")
        late = _start_tick(tick_env, "--no-linger")  # as root: the limited user has no third connection
        late_out, late_err = late.communicate(timeout=120)
        assert _lock_holder(mysql_admin, database.name) == holder, "the tick ended before the late one looked"
        # Every check is done: stop the tick now rather than at --max-time (this test holds the server-settings
        # lock exclusive, so every other MariaDB test of the run waits while it lingers).
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        stop.set()
        sampler.join()
        if proc.poll() is None:  # a step above failed: no tick left behind
            proc.kill()
            proc.communicate()
    assert late.returncode == 0 and late_out.strip() == "skipped: tick already running", late_out + late_err
    assert proc.returncode == 0, out + err
    assert "delivered 1" in out and "stopped: signal" in out
    assert max(seen_connections) == 2  # lock + work, never more (the server would refuse a third: 1226)
    assert [d.status for d in deliveries(runtime)] == ["done"]


def test_lock_wait_timeouts_are_retried(runtime):
    """1205 (lock wait timeout) inside in_transaction is retried, then succeeds once the lock is free."""
    from cronbox.outbox.engine.models import Heartbeat

    with runtime.sessions.begin() as session:
        session.execute(insert(Heartbeat).values(command="x", host="h", pid=1, started_at=text("NOW(6)"),
                                                 outcome="ok", delivered=0, retried=0, dead=0, jobs_done=0,
                                                 jobs_failed=0))
    holder_engine = create_engine(runtime.settings.database_url, poolclass=NullPool,
                                  connect_args={"ssl_disabled": True})
    holder = holder_engine.connect()
    holder.begin()
    holder.execute(text("UPDATE cronbox_heartbeats SET pid = 2"))  # holds the row lock
    threading.Timer(1.5, lambda: (holder.commit(), holder.close())).start()
    attempts = []

    def work(session):
        attempts.append(1)
        session.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
        session.execute(text("UPDATE cronbox_heartbeats SET pid = 3"))

    in_transaction(runtime.sessions, work)
    assert len(attempts) >= 2
    with runtime.sessions() as session:
        assert session.execute(text("SELECT pid FROM cronbox_heartbeats")).scalar() == 3
    holder_engine.dispose()


def test_lock_conflicts_are_retried_a_bounded_number_of_times(runtime):
    attempts = []

    def always_deadlocks(session):
        attempts.append(1)
        raise OperationalError("UPDATE ...", {}, Exception(1213, "Deadlock found when trying to get lock"))

    with pytest.raises(OperationalError):
        in_transaction(runtime.sessions, always_deadlocks, retries=3)
    assert len(attempts) == 4


def test_a_one_off_migrate_inside_the_tick_needs_no_third_connection(runtime, tick_env, limited_user):
    """The command's lock is taken on the tick's lock connection: with max_user_connections=2 a
    third connection would be refused (1226) and the request would fail."""
    from cronbox.cron.scheduling import once

    user, url = limited_user
    with runtime.sessions.begin() as session:
        once.add(session, ["migrate"], source="cli")
    proc = subprocess.run([sys.executable, "-m", "cronbox", "tick", "--no-linger"],
                          env=child_env({**tick_env, "DATABASE_URL": url}), cwd="/", capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "one-off runs 1" in proc.stdout
    with runtime.sessions() as session:
        [row] = once.page(session, size=5).rows
    assert row.status == "done" and row.exit_code == 0


def test_a_migrate_request_file_lets_a_tick_bring_the_schema_up_first(env, database, tmp_path):
    """No SSH: after a deploy whose code needs a newer schema, the tick refuses to run, unless the
    operator dropped a `migrate` request file; then it migrates first and carries on."""
    from tests.db.test_ops import write_cmd

    proc = run_cli(env, "tick", "--no-linger")
    assert proc.returncode == 1 and "run `python -m cronbox migrate`" in proc.stderr
    inbox = tmp_path / "instance" / "run-once"
    write_cmd(inbox, "deploy.cmd", b"migrate\n")
    proc = run_cli(env, "tick", "--no-linger")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (inbox / "deploy.cmd").exists() and len(list((inbox / "archive").iterdir())) == 1
    listed = run_cli(env, "once", "list")
    assert "file:deploy.cmd" in listed.stdout and "done" in listed.stdout
    shown = run_cli(env, "once", "show", "1")
    assert "migrate: empty -> " in shown.stdout


def test_a_handler_longer_than_the_servers_wait_timeout_keeps_the_work_connection(
        runtime, tick_env, short_wait_timeout, tmp_path):
    """wait_timeout=2 (as on many shared hosts, 20 s); handlers of 3 s. The worker's held
    connection must survive them: no 'connection lost', every job run exactly once."""
    from tests.handlers import jobs as test_jobs

    runs = tmp_path / "runs"
    runs.mkdir()
    with runtime.sessions.begin() as session:
        for n in range(2):
            test_jobs.slow.job.dispatch(session, {"n": n})
    proc = subprocess.run([sys.executable, "-m", "cronbox", "queue", "work", "--stop-when-empty"],
                          env=child_env({**tick_env, "CRONBOX_HANDLERS": "tests.handlers.jobs", "TEST_SLEEP": "3",
                                         "TEST_RUNS_DIR": str(runs)}),
                          cwd="/", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 jobs (2 done" in proc.stdout
    lines = [line for path in runs.iterdir() for line in path.read_text().splitlines()]
    assert sorted(line.split()[0] for line in lines) == ["0", "1"]
    logs = "".join(p.read_text() for p in runtime.settings.logs_dir.glob("cronbox-*.log"))
    assert "connection lost" not in logs


def test_a_pooled_connection_killed_while_idle_is_replaced_at_checkout_and_a_busy_one_is_not_pinged(
        settings, mysql_admin):
    """The idle ping (outbox/core/engines.py): back-to-back transactions pay no ping round trip; a
    connection the server killed while it sat in the pool is found dead before the caller's
    transaction and replaced, so the caller never sees the disconnect."""
    from cronbox.outbox.core import engines
    engine = make_engine(settings, role="web")
    pings = []
    real_ping = engine.dialect.do_ping
    engine.dialect.do_ping = lambda dbapi_connection: pings.append(1) or real_ping(dbapi_connection)
    try:
        with engine.connect() as connection:
            first = connection.execute(text("SELECT CONNECTION_ID()")).scalar()
        for _ in range(5):
            with engine.begin() as connection:
                assert connection.execute(text("SELECT CONNECTION_ID()")).scalar() == first
        assert pings == []  # none of those checkouts came after an idle spell
        kill_connection(mysql_admin, first)
        time.sleep(engines.PING_WHEN_IDLE + 0.1)
        with engine.begin() as connection:
            second = connection.execute(text("SELECT CONNECTION_ID()")).scalar()
        assert pings == [1] and second != first
    finally:
        engine.dispose()
