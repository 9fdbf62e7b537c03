"""The user's own Celery app, for tests/processes/test_celery_jobs.py: `celery -A tests.handlers.celery_app
worker` runs its task "cronbox_test.write", which writes a test_consumed row (consumer "celery", n)
into the test's database (TEST_CELERY_DB) and appends its arguments to TEST_CALLS_FILE.
Broker: TEST_CELERY_BROKER (the test's vhost). Nothing here knows cronbox."""
from __future__ import annotations

import json
import os
import time

from celery import Celery
from sqlalchemy import create_engine, insert

from tests.handlers.consuming import consumed

app = Celery("cronbox_test", broker=os.environ["TEST_CELERY_BROKER"])
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)
_engine = None


@app.task(name="cronbox_test.write")
def write(n, note=None):
    global _engine
    _engine = _engine or create_engine(os.environ["TEST_CELERY_DB"])
    with _engine.begin() as connection:
        connection.execute(insert(consumed).values(consumer="celery", n=n, attempt=0, at=time.time()))
    with open(os.environ["TEST_CALLS_FILE"], "a") as out:
        out.write(json.dumps([n, note, write.request.id]) + "\n")
