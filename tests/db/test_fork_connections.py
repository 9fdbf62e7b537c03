"""A forked child (a worker pool's) drops the pooled connections it inherited: it works on fresh ones,
and the parent's stay open and usable (the child sent nothing on them)."""
from __future__ import annotations

import json
import os
import warnings

from sqlalchemy import create_engine, text

MARKER = "cronbox_parent_marker"


def mark(engine, is_mysql: bool) -> None:
    """Leave state on the engine's pooled connection that lives only as long as that connection."""
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":  # a session setting (committed below, so it stays)
            connection.execute(text(f"SELECT set_config('cronbox.{MARKER}', 'parent', false)"))
        elif is_mysql:
            connection.execute(text(f"SET @{MARKER} = 'parent'"))
        else:
            connection.execute(text(f"CREATE TEMP TABLE {MARKER} (x INTEGER)"))
        connection.commit()


def state_of(engine, is_mysql: bool) -> dict:
    """What the connection the engine's pool hands out says about itself."""
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            marker = connection.execute(text(f"SELECT current_setting('cronbox.{MARKER}', true)")).scalar() or None
            server_id = connection.execute(text("SELECT pg_backend_pid()")).scalar()
        elif is_mysql:
            marker = connection.execute(text(f"SELECT @{MARKER}")).scalar()
            server_id = connection.execute(text("SELECT CONNECTION_ID()")).scalar()
        else:
            marker = connection.execute(text("SELECT name FROM sqlite_temp_master WHERE name = :n"),
                                        {"n": MARKER}).scalar()
            server_id = None
        return {"marker": marker, "server_id": server_id}


def in_forked_child(work) -> object:
    """Run `work` in a forked child; its JSON result, or AssertionError with the child's error."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        # This fork is the test's own, made in pytest-xdist's worker, which runs execnet's thread: Python
        # 3.12+ warns about any fork in a threaded process. cronbox's own (the pool's, outbox/queue/pool.py)
        # is made before its child starts its only thread.
        warnings.filterwarnings("ignore", "This process .* is multi-threaded, use of fork", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            os.close(read)
            try:
                payload = {"result": work()}
            except BaseException as exc:
                payload = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(write, json.dumps(payload).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    payload = json.loads(data)
    assert "error" not in payload, payload.get("error")
    return payload["result"]


def test_a_forked_child_opens_its_own_connections_and_the_parents_stay_usable(runtime):
    is_mysql, is_server = runtime.is_mysql, runtime.is_server
    host = create_engine(runtime.engine.url)  # a host app's engine (Flask-SQLAlchemy's, cronbox.web.hosting)
    runtime.host_engines = lambda: [host]
    engines = [runtime.engine, host]
    try:
        for engine in engines:
            mark(engine, is_mysql)
        parent = [state_of(engine, is_mysql) for engine in engines]
        assert all(state["marker"] is not None for state in parent)

        def child():
            kept = [engine.pool for engine in engines]  # noqa: F841  (the parent's pools stay alive here)
            runtime.drop_inherited_connections()
            return [state_of(engine, is_mysql) for engine in engines]

        for state, before in zip(in_forked_child(child), parent):
            assert state["marker"] is None  # a connection of its own, not the parent's
            if is_server:
                assert state["server_id"] != before["server_id"]
        # The parent's pooled connections are the same ones, open, their state intact.
        assert [state_of(engine, is_mysql) for engine in engines] == parent
    finally:
        host.dispose()
