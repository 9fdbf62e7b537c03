"""What only a real PostgreSQL server shows: the run lock as a session advisory lock (taken once,
lost with its connection, taken back), the identity columns' byte order, the lock-wait bound, and
LISTEN/NOTIFY waking a lingering run at COMMIT, never at a rollback, with polling behind it."""
from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from cronbox import record
from cronbox.cron.schema import metadata
from cronbox.outbox.core import clock
from cronbox.outbox.core.lock_wait import bound_lock_wait
from cronbox.outbox.core.locks import CONFIRMED_FOR, PostgresLock
from cronbox.outbox.core.models import ExactString
from cronbox.outbox.core.notify import Listener, own_listener
from cronbox.outbox.core.sql import starts_with
from cronbox.outbox.events.models import OutboxEvent
from cronbox.outbox.queue.jobs import job
from tests.helpers import wait_for
from sqlalchemy import select

pytestmark = pytest.mark.backends("postgresql")


def terminate(admin, pid: int) -> None:
    """pg_terminate_backend, then wait until the backend is gone (it ends a moment later)."""
    with admin.connect() as connection:
        connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        deadline = time.monotonic() + 60
        while connection.execute(text("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}).scalar():
            assert time.monotonic() < deadline, f"backend {pid} still there 60 s after pg_terminate_backend"
            time.sleep(0.02)


def backend_pid(connection) -> int:
    return connection.connection.dbapi_connection.info.backend_pid


def test_the_run_lock_is_one_holders_and_a_second_run_skips(runtime):
    first, second = runtime.lock("tick"), runtime.lock("tick")
    assert isinstance(first.backend, PostgresLock)
    assert first.acquire() and not second.acquire()
    assert first.ensure()
    first.release()
    assert second.acquire()
    second.release()


def test_a_lock_whose_connection_was_terminated_is_found_lost_then_taken_back(runtime, postgres_admin, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(clock, "monotonic", lambda: now[0])
    lock = runtime.lock("probe")
    assert lock.acquire()
    old = backend_pid(lock.connection)
    terminate(postgres_admin, old)
    assert lock.backend.held()  # within CONFIRMED_FOR of the server's last word: not asked again
    now[0] += CONFIRMED_FOR
    assert not lock.backend.held()  # asked: the connection is gone, and the lock with it
    assert lock.ensure()  # free, so taken again on a new connection
    assert backend_pid(lock.connection) != old
    other = runtime.lock("probe")
    assert not other.acquire()
    lock.release()


def test_a_lock_taken_meanwhile_by_another_run_is_not_taken_back(runtime, postgres_admin, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(clock, "monotonic", lambda: now[0])
    lock, thief = runtime.lock("probe"), runtime.lock("probe")
    assert lock.acquire()
    terminate(postgres_admin, backend_pid(lock.connection))
    assert thief.acquire()
    now[0] += CONFIRMED_FOR
    assert not lock.ensure()
    thief.release()


def test_identity_columns_order_by_bytes_and_the_trigger_is_in_place(runtime):
    with runtime.engine.connect() as connection:
        collations = dict(connection.execute(text(
            "SELECT table_name || '.' || column_name, collation_name FROM information_schema.columns "
            "WHERE table_name LIKE 'cronbox%' AND collation_name IS NOT NULL")).all())
        triggers = {row[0] for row in connection.execute(text(
            "SELECT event_object_table FROM information_schema.triggers WHERE trigger_name LIKE 'cronbox%'"))}
    identity = {f"{table.name}.{column.name}" for table in metadata.tables.values() for column in table.columns
                if isinstance(column.type, ExactString)}
    assert identity and {name: collations.get(name) for name in identity} == dict.fromkeys(identity, "C")
    assert triggers == {"cronbox_events", "cronbox_jobs"}
    with runtime.sessions.begin() as session:
        for event_type in ("a:Z", "a:a", "a:\u00e9", "b:a", "A:b"):  # 'Z' < 'a' < 'é' by bytes, not by language
            record(session, event_type, {})
    with runtime.sessions() as session:
        found = session.scalars(select(OutboxEvent.type).where(starts_with(OutboxEvent.type, "a:"))
                                .order_by(OutboxEvent.type)).all()
    assert found == ["a:Z", "a:a", "a:\u00e9"]


def test_the_lock_wait_bound_survives_a_rolled_back_transaction(runtime):
    with runtime.engine.connect() as connection:
        assert bound_lock_wait(connection, 3.2) == 4
        assert connection.execute(text("SHOW lock_timeout")).scalar() == "4s"
        connection.rollback()
        assert connection.execute(text("SHOW lock_timeout")).scalar() == "4s"  # committed, not undone
        connection.rollback()
        connection.execute(text("SELECT 1"))  # a transaction begun
        assert bound_lock_wait(connection, 1.5) == 2  # inside a transaction: for that one alone
        assert connection.execute(text("SHOW lock_timeout")).scalar() == "2s"
        connection.rollback()
        assert connection.execute(text("SHOW lock_timeout")).scalar() == "4s"
        connection.rollback()
        assert bound_lock_wait(connection, 1.5) == 2  # not remembered: sent again, now outside one
        connection.rollback()
        assert connection.execute(text("SHOW lock_timeout")).scalar() == "2s"


def listening(runtime):
    made = own_listener(runtime.lock_engine)
    assert made is not None
    listener, close = made
    listener.listen()
    return listener, close


def commit_later(runtime, delay: float, *, rollback: bool = False, write=None):
    """In another thread, after `delay`: record an event (or `write(session)`), then commit or roll back."""
    def run():
        time.sleep(delay)
        with runtime.sessions() as session:
            (write or (lambda s: record(s, "listen.me", {})))(session)
            session.rollback() if rollback else session.commit()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("kind", ["event", "job"])
def test_a_commit_wakes_the_listener_at_once(runtime, registry, kind):
    remind = job("q", name="pg.remind", registry=registry)(lambda payload, ctx: None)
    listener, close = listening(runtime)
    try:
        writer = commit_later(runtime, 0.3, write=(lambda s: remind.dispatch(s, {})) if kind == "job" else None)
        started = time.monotonic()
        assert listener.wait(60)  # True: a notification came
        assert time.monotonic() - started < 30  # at once: not at the end of the wait
        writer.join()
        assert not listener.wait(0.2)  # one wake-up per commit: the rest were taken with it
    finally:
        close()


def test_a_rollback_wakes_nobody(runtime):
    listener, close = listening(runtime)
    try:
        writer = commit_later(runtime, 0.1, rollback=True)
        assert not listener.wait(1.5)
        writer.join()
    finally:
        close()


def test_a_dropped_listening_connection_falls_back_to_polling_and_listens_again(runtime, postgres_admin, caplog,
                                                                                  monkeypatch):
    from cronbox.outbox.core import notify

    monkeypatch.setattr(notify, "RETRY_LISTEN", 0.0)  # listen again at the next wait, not 5 s later
    listener, close = listening(runtime)
    try:
        pid = next(iter(_listening_pids(postgres_admin, runtime)))
        terminate(postgres_admin, pid)
        assert not listener.wait(0.5)  # the wait fails, quietly, as a poll would
        assert "polling until it is back" in caplog.text
        listener.listen()  # the next wait listens on a new connection
        assert _listening_pids(postgres_admin, runtime) - {pid}
        writer = commit_later(runtime, 0.2)
        assert listener.wait(60)
        writer.join()
    finally:
        close()


def _listening_pids(admin, runtime) -> set[int]:
    with admin.connect() as connection:
        return {row[0] for row in connection.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE datname = :db AND query LIKE 'LISTEN%'"),
            {"db": runtime.engine.url.database})}


def test_a_listener_on_a_lock_connection_listens_again_after_the_lock_is_taken_back(runtime, postgres_admin,
                                                                                    monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(clock, "monotonic", lambda: now[0])
    lock = runtime.lock("tick")
    assert lock.acquire()
    listener = Listener(lambda: lock.connection)
    listener.listen()
    terminate(postgres_admin, backend_pid(lock.connection))
    now[0] += CONFIRMED_FOR
    assert lock.ensure()  # a new connection
    monkeypatch.undo()
    writer = commit_later(runtime, 0.2)
    assert listener.wait(60)  # LISTEN was sent again on the new one
    writer.join()
    lock.release()


# --- a lingering worker and tick, as cron starts them ------------------------------------------------

def _done(runtime) -> list[int]:
    from cronbox.outbox.queue.models import Job

    with runtime.sessions() as session:
        return sorted(row.id for row in session.scalars(select(Job).where(Job.status == "done")))


def test_a_lingering_worker_whose_listening_connection_is_dropped_loses_no_job(runtime, env, tmp_path,
                                                                               postgres_admin):
    """The worker listens on a connection of its own; terminated, it goes on by polling, says so in one
    log line, listens again on a new connection, and every job dispatched meanwhile is done."""
    from tests.conftest import start_cli
    from tests.handlers import jobs as test_jobs

    runs = tmp_path / "runs"
    runs.mkdir()
    worker = start_cli({**env, "CRONBOX_HANDLERS": "tests.handlers.jobs", "TEST_RUNS_DIR": str(runs)},
                       "queue", "work", "--max-time", "30")
    try:
        wait_for(lambda: _listening_pids(postgres_admin, runtime), "the worker's LISTEN")
        (first,) = _listening_pids(postgres_admin, runtime)
        with runtime.sessions.begin() as session:
            before = test_jobs.record_run.dispatch(session, {"n": 1})
        wait_for(lambda: before in _done(runtime), "the job dispatched while it listened")
        terminate(postgres_admin, first)
        with runtime.sessions.begin() as session:
            during = test_jobs.record_run.dispatch(session, {"n": 2})
        wait_for(lambda: during in _done(runtime), "the job dispatched after the drop (by polling)")
        wait_for(lambda: _listening_pids(postgres_admin, runtime) - {first}, "a new LISTEN")
        with runtime.sessions.begin() as session:
            after = test_jobs.record_run.dispatch(session, {"n": 3})
        wait_for(lambda: after in _done(runtime), "the job dispatched once it listened again")
    finally:
        worker.terminate()
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    log = "".join(p.read_text() for p in (tmp_path / "instance" / "logs").glob("*.log"))
    assert "polling until it is back" in log
    assert not _listening_pids(postgres_admin, runtime)  # closed with the run


def test_a_lingering_tick_listens_on_its_lock_connection_and_delivers(runtime, env, tmp_path, postgres_admin):
    from tests.conftest import start_cli
    from tests.handlers.effects import effects, metadata as effects_metadata

    effects_metadata.create_all(runtime.engine)
    tick = start_cli({**env, "CRONBOX_HANDLERS": "tests.handlers.effects",
                      "TEST_EFFECTS_FILE": str(tmp_path / "effects.txt")}, "tick", "--max-time", "20")
    try:
        wait_for(lambda: _listening_pids(postgres_admin, runtime), "the tick's LISTEN")
        with postgres_admin.connect() as connection:  # the one connection that listens holds the tick's lock
            (holder,) = connection.execute(text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = :db)"), {"db": runtime.engine.url.database}).all()
        assert {holder[0]} == _listening_pids(postgres_admin, runtime)
        with runtime.sessions.begin() as session:
            event = record(session, "work", {})
        with runtime.engine.connect() as connection:
            wait_for(lambda: connection.execute(select(effects.c.event_id).where(
                effects.c.consumer == "effects.db")).scalars().all() == [event.id], "the consumer's write")
    finally:
        tick.terminate()
        tick.communicate(timeout=60)


def test_a_transaction_the_server_aborted_is_never_committed_as_if_whole(runtime):
    """A handler that catches an error of a statement it sent past ctx.session's watch (through
    ctx.session.connection()) and goes on: PostgreSQL aborted the transaction, and its COMMIT would
    roll back without a word, after which a broker message would be acked. The commit refuses."""
    from cronbox.outbox.core.errors import TransactionAborted
    from cronbox.outbox.engine.context import Context
    from sqlalchemy.exc import DBAPIError

    with runtime.engine.connect() as connection:
        ctx = Context(attempt=1, trace_id="t", idempotency_key="k", connection=connection)
        ctx.session.execute(text("SELECT 1"))
        with pytest.raises(DBAPIError):
            ctx.session.connection().execute(text("SELECT 1 / 0"))
        assert ctx.session.failed_with is None  # not seen by the session: only the server knows
        with pytest.raises(TransactionAborted, match="nothing of it was kept"):
            ctx.commit_now()
        ctx.discard_session()
