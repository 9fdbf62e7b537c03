"""Jobs for the worker pool tests (CRONBOX_HANDLERS=tests.handlers.pool_jobs).

pool.insert  inserts the row of its `n` into test_pool_done, whose primary key is `n`: a job run twice
             cannot commit twice (its second insert fails), and the row says which process ran it
pool.hold    writes its pid to TEST_INSIDE_DIR/hold-<n>, waits for TEST_RELEASE_FILE (at most 3.5 s),
             then inserts like pool.insert: a job known to be mid-way (pool.hold_long: at most 55 s)
TEST_SLEEP   seconds pool.insert sleeps first
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, Table, insert, text

import cronbox

metadata = MetaData()
done = Table("test_pool_done", metadata, Column("n", Integer, primary_key=True, autoincrement=False),
             Column("pid", Integer), Column("attempt", Integer), Column("connection_id", Integer),
             Column("lock_holder", Integer))


def _insert(ctx, n: int) -> None:
    connection_id = lock_holder = None
    if ctx.session.get_bind().dialect.name in ("mysql", "mariadb"):
        # Which connection this worker uses, and which one holds the tick's lock right now.
        connection_id, lock_holder = ctx.session.execute(
            text("SELECT CONNECTION_ID(), IS_USED_LOCK(CONCAT(DATABASE(), :purpose))"), {"purpose": ":tick"}).one()
    ctx.session.execute(insert(done).values(n=n, pid=os.getpid(), attempt=ctx.attempt,
                                            connection_id=connection_id, lock_holder=lock_holder))


@cronbox.job("default", name="pool.insert", tries=5, timeout=2)
def insert_once(payload, ctx):
    seconds = float(os.environ.get("TEST_SLEEP") or 0)
    if seconds:
        time.sleep(seconds)
    _insert(ctx, payload["n"])


def _hold(payload, ctx, seconds: float) -> None:
    Path(os.environ["TEST_INSIDE_DIR"], f"hold-{payload['n']}").write_text(f"{os.getpid()} {ctx.attempt}")
    release = Path(os.environ["TEST_RELEASE_FILE"])
    deadline = time.monotonic() + seconds
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    _insert(ctx, payload["n"])


@cronbox.job("default", name="pool.hold", tries=5, timeout=4)
def hold(payload, ctx):
    _hold(payload, ctx, 3.5)  # within its timeout: its lease (4 s) is what a replacement waits out


@cronbox.job("default", name="pool.hold_long", tries=5, timeout=60)
def hold_long(payload, ctx):
    _hold(payload, ctx, 55)
