"""Consumers for the benchmarks (CRONBOX_HANDLERS=bench.handlers)."""
from __future__ import annotations

import time

from sqlalchemy import Column, Float, Index, Integer, MetaData, String, Table, insert

import cronbox

metadata = MetaData()
rows = Table("bench_rows", metadata, Column("id", Integer, primary_key=True), Column("event_id", Integer),
             Column("note", String(32)))
# The one-row consumers and jobs run this statement with parameters, as a handler written for speed
# would (and as cronbox's own record() does): a statement built per call with .values() is keyed and
# looked up in SQLAlchemy's compiled cache each time (~150 µs of Python per item here).
insert_row = insert(rows)
latencies = Table("bench_latency", metadata, Column("id", Integer, primary_key=True), Column("seconds", Float))
# The hand-written baseline's own queue (bench_outbox.hand_loop): what a user would write without cronbox.
hand_queue = Table("bench_hand_queue", metadata, Column("id", Integer, primary_key=True),
                   Column("status", String(8), nullable=False), Column("payload", String(64), nullable=False),
                   Index("ix_bench_hand_queue_status_id", "status", "id"))


@cronbox.consumer("bench.noop", name="bench.noop")
def noop(event, ctx):
    """No database effect: its ack is batched with others."""


@cronbox.consumer("bench.write", name="bench.write")
def write(event, ctx):
    """One row through ctx.session: committed together with the ack."""
    ctx.session.execute(insert_row, {"event_id": event.id, "note": "x"})


@cronbox.consumer("bench.write_grouped", name="bench.write_grouped", grouped=True)
def write_grouped(event, ctx):
    """The same row, with group commit: many deliveries' rows and acks share one COMMIT."""
    ctx.session.execute(insert_row, {"event_id": event.id, "note": "x"})


@cronbox.consumer("bench.latency", name="bench.latency")
def latency(event, ctx):
    """commit -> consumer latency: the payload carries the wall time just after commit was requested."""
    ctx.session.execute(insert(latencies).values(seconds=time.time() - event.payload["committed_at"]))




# ---- jobs (bench_queue) --------------------------------------------------------------

_counter = None


@cronbox.job("bench", name="bench.job.noop", timeout=30)
def job_noop(payload, ctx):
    """Nothing at all: the queue's own cost."""


@cronbox.job("bench", name="bench.job.write", timeout=30)
def job_write(payload, ctx):
    """One row through ctx.session: committed together with the ack, one transaction per job."""
    ctx.session.execute(insert_row, {"event_id": payload["i"], "note": "j"})


@cronbox.job("bench", name="bench.job.write_grouped", timeout=30, grouped=True)
def job_write_grouped(payload, ctx):
    """The same row, with group commit."""
    ctx.session.execute(insert_row, {"event_id": payload["i"], "note": "j"})


@cronbox.job("bench", name="bench.job.bump", timeout=30)
def job_bump(payload, ctx):
    """The peer harness's job body: one autocommit UPDATE on its own MariaDB connection."""
    global _counter
    import pymysql

    if _counter is None:
        _counter = pymysql.connect(host="127.0.0.1", user="root", password="", database="test", autocommit=True,
                                   ssl_disabled=True)
    with _counter.cursor() as cursor:
        cursor.execute("UPDATE bench_counter SET n = n + 1 WHERE name = 'cronbox-bench'")
