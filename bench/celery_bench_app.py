"""The Celery side of bench_broker_jobs.py: a plain Celery app whose one task writes the one row the
cronbox job writes (floor_handlers.job_write, floor_sql.ROW_INSERT), in its own transaction.

    celery -A celery_bench_app worker -P solo -c 1 -Q $BENCH_CELERY_QUEUE      (bench/ on PYTHONPATH)

BENCH_CELERY_BROKER: the RabbitMQ URL; BENCH_CELERY_QUEUE: the run's own queue; BENCH_CELERY_DB: the
database (engine made as floor_sql makes the floors', so as cronbox documents its own). No result
backend, acks_late, prefetch 10 (`amqp work`'s default). Nothing here knows cronbox.
"""
from __future__ import annotations

import os

from celery import Celery

app = Celery("cronbox_bench", broker=os.environ["BENCH_CELERY_BROKER"])
app.conf.update(
    task_default_queue=os.environ["BENCH_CELERY_QUEUE"],
    task_acks_late=True,
    task_ignore_result=True,
    result_backend=None,
    worker_prefetch_multiplier=10,  # with -c 1: 10 unacked, as `amqp work --prefetch 10`
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
_engine = None


@app.task(name="bench.write_row")
def write_row(i):
    """The one row, committed (floor_sql.ROW_INSERT: the statement cronbox's job runs through ctx.session)."""
    global _engine
    import floor_sql  # bench/floor_sql.py: only the worker needs SQLAlchemy

    if _engine is None:
        _engine = floor_sql.engine_for(os.environ["BENCH_CELERY_DB"])
    with _engine.begin() as c:
        c.execute(floor_sql.ROW_INSERT, {"event_id": i})
