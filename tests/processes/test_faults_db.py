"""The database connection cut under a running tick: a loopback TCP proxy (tests/tcp_proxy.py) sits
between the tick and the server (MariaDB, PostgreSQL) and kills both of its connections (lock and
work; on PostgreSQL the lock connection is also the one listening) at a chosen moment, then refuses
new ones until the test lets them through again. The shared server is never stopped."""
from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from cronbox.outbox.events.models import Delivery
from cronbox.outbox.queue.models import Job
from tests.conftest import start_cli
from tests.handlers.effects import effects, metadata as effects_metadata
from tests.handlers.faults import write as write_job
from tests.helpers import run_until, wait_for
from tests.tcp_proxy import TcpProxy
from tests.db.test_mysql import _lock_holder
from tests.processes.test_tick import heartbeats, record

# The proxy is TCP, so no SQLite; MariaDB's claim modes are both covered where batches are cut.
pytestmark = pytest.mark.backends("mysql-skip-locked", "postgresql")
HANDLERS = "tests.handlers.effects,tests.handlers.faults"


@pytest.fixture
def proxy(database):
    url = make_url(database.url)
    with TcpProxy(url.port or (5432 if database.is_postgresql else 3306)) as p:
        yield p


def lock_holder(request, database) -> int | None:
    """The connection holding the tick's run lock, asked from an admin connection: MariaDB's
    IS_USED_LOCK, PostgreSQL's pg_locks (cronbox takes the only advisory locks in the test's database)."""
    if database.is_postgresql:
        with request.getfixturevalue("postgres_admin").connect() as connection:
            return connection.execute(text(
                "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = :db"), {"db": database.name}).scalar()
    return _lock_holder(request.getfixturevalue("mysql_admin"), database.name)


@pytest.fixture
def tick_env(env, runtime, proxy, tmp_path):
    effects_metadata.create_all(runtime.engine)
    return {**env, "DATABASE_URL": proxy.url(env["DATABASE_URL"]), "CRONBOX_HANDLERS": HANDLERS,
            "TEST_EFFECTS_FILE": str(tmp_path / "effects.txt")}


def log_text(runtime) -> str:
    return "".join(p.read_text() for p in sorted(runtime.settings.logs_dir.glob("cronbox-*.log")))


def pauses(runtime) -> int:
    """How many times a run saw the database go and paused before reconnecting."""
    return log_text(runtime).count("pausing 3s, then reconnecting")


def db_effects(runtime, consumer: str) -> Counter:
    with runtime.sessions() as session:
        return Counter(dict(session.execute(select(effects.c.event_id, func.count())
                                            .where(effects.c.consumer == consumer).group_by(effects.c.event_id)).all()))


def not_done(runtime) -> int:
    with runtime.sessions() as session:
        return (session.scalar(select(func.count()).select_from(Delivery).where(Delivery.status != "done"))
                + session.scalar(select(func.count()).select_from(Job).where(Job.status != "done")))


def cut_until_paused(runtime, proxy: TcpProxy) -> None:
    """Kill both connections and refuse new ones until the run has noticed and paused, then let it in."""
    seen = pauses(runtime)
    proxy.refuse()
    assert proxy.cut() >= 1
    wait_for(lambda: pauses(runtime) > seen, "the run to notice the lost connection", 60)
    proxy.accept()


def finish(proc, timeout: float = 180) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert "Traceback" not in out + err and "Logging error" not in err, out + err
    return out, err


def test_a_cut_while_the_tick_lingers_is_waited_out_and_later_events_are_delivered(runtime, tick_env, proxy,
                                                                                 request, database):
    # --max-time leaves room on a loaded machine for what must happen inside the run: a first pass
    # (its scheduled tasks too), two refused rounds of 3 s, the reconnect and three deliveries.
    proc = start_cli(tick_env, "tick", "--max-time", "30")
    wait_for(lambda: lock_holder(request, database) is not None, "the tick to take its lock")
    [first] = record(runtime, "ping", 1)
    wait_for(lambda: db_effects(runtime, "effects.ping") == {first: 1}, "the first event to be delivered")
    holder = lock_holder(request, database)

    seen = pauses(runtime)
    proxy.refuse()
    assert proxy.cut() == 2  # the lock connection and the work connection: both went through the proxy
    later = record(runtime, "ping", 3)  # committed while the tick cannot reach the database
    # Refused through two rounds (~4 s): the second finds the lock connection dead and the server
    # unreachable; the run must wait that out too, not take it for a lock lost to another tick.
    wait_for(lambda: pauses(runtime) >= seen + 2, "the tick to find the database gone twice", 60)
    proxy.accept()

    out, err = finish(proc)
    assert proc.returncode == 0, out + err
    assert out.count("\n") == 1 and "delivered 4" in out and "stopped: max-time" in out, out
    assert err == ""
    assert db_effects(runtime, "effects.ping") == Counter({i: 1 for i in [first, *later]})
    assert lock_holder(request, database) is None  # released at the end
    logs = log_text(runtime)
    assert f"lock {database.name}:tick re-taken" in logs and "could not be re-taken" not in logs
    [beat] = heartbeats(runtime)
    assert beat.outcome == "max-time" and beat.delivered == 4 and holder is not None


@pytest.mark.slow
@pytest.mark.backends("mysql-skip-locked", "mysql-token", "postgresql")
def test_a_cut_in_the_middle_of_relay_and_worker_batches_loses_nothing_and_applies_once(
        runtime, tick_env, proxy, tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    ids = record(runtime, "faulty", 12)
    with runtime.sessions.begin() as session:
        for n in range(12):
            write_job.job.dispatch(session, {"n": n})
    # Two cut batches, each waited out (3 s at least) and run again, in one run: room for that on a
    # loaded machine.
    proc = start_cli({**tick_env, "TEST_GATE_DIR": str(gates), "TEST_GATE_AT": "5"}, "tick", "--max-time", "30")

    for kind in ("consumer", "job"):  # the relay's batch first, then the worker's
        wait_for((gates / f"{kind}.inside").exists, f"the {kind} batch to reach its fifth item", 60)
        seen = pauses(runtime)
        proxy.refuse()
        assert proxy.cut() >= 1
        (gates / f"{kind}.release").write_text("go")
        wait_for(lambda: pauses(runtime) > seen, "the tick to notice the lost connection", 60)
        proxy.accept()

    out, err = finish(proc)
    assert proc.returncode == 0, out + err
    assert "stopped: max-time" in out and err == ""
    def follow_up() -> None:  # leases (3 s) of what the cut batches held may outlast the first tick
        follow = start_cli(tick_env, "tick", "--no-linger")
        out, err = finish(follow)
        assert follow.returncode == 0, out + err

    if not_done(runtime):
        run_until(follow_up, lambda: not_done(runtime) == 0, pause=1)
    assert not_done(runtime) == 0
    assert db_effects(runtime, "faults.db") == Counter({i: 1 for i in ids})  # DB effects exactly once
    assert db_effects(runtime, "faults.write") == Counter({n: 1 for n in range(12)})
    quiet = Counter(int(line) for line in Path(tick_env["TEST_EFFECTS_FILE"]).read_text().split())
    assert set(quiet) == set(ids)  # external effects at least once: every acked delivery was done
    assert pauses(runtime) >= 2


def test_a_database_gone_for_the_rest_of_the_run_ends_it_by_max_time_with_one_line(runtime, tick_env, proxy):
    # Long enough that, after a first pass slowed by a loaded machine, the database is gone for two
    # 3 s pauses at least before the run's time is up.
    proc = start_cli(tick_env, "tick", "--max-time", "20")
    [first] = record(runtime, "ping", 1)
    wait_for(lambda: db_effects(runtime, "effects.ping") == {first: 1}, "the tick to be in its loop")
    proxy.refuse()
    proxy.cut()
    later = record(runtime, "ping", 2)  # committed, never reachable by this tick: left for the next one
    out, err = finish(proc)
    assert proc.returncode == 1, out + err
    lines = (out + err).splitlines()
    assert len(lines) == 1 and "database unreachable until the end of the run" in lines[0], out + err
    assert "stopped: lost-connection" in lines[0]
    assert pauses(runtime) >= 2  # it kept trying until --max-time, not giving up at the first failure

    proxy.accept()
    proc = start_cli(tick_env, "tick", "--no-linger")
    out, err = finish(proc)
    assert proc.returncode == 0 and "delivered 2" in out, out + err
    assert db_effects(runtime, "effects.ping") == Counter({i: 1 for i in [first, *later]})
