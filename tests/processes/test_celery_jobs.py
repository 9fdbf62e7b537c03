"""Celery as a destination (forward_jobs(protocol="celery"), celery_task): jobs dispatched in the
caller's transaction reach a real `celery worker` (Celery from PyPI, RabbitMQ on loopback) as Celery
task messages: committed ones run once, rolled-back ones never, and the broker down for a while only
delays them."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from cronbox.outbox.core import clock
from cronbox.outbox.queue.forward_jobs import celery_task
from cronbox.outbox.queue.models import Job
from tests.conftest import APP_ROOT, child_env
from tests.handlers.consuming import consumed, metadata as consumed_metadata
from tests.broker_rows import publish_jobs as publish
from tests.rabbit import url

# Celery's side is the same on every backend; cronbox's claim, publish and ack SQL for forwarded queues
# runs on each in tests/db/test_broker_jobs.py.
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

J = Job.__table__


@pytest.fixture
def celery_queue(env, runtime, registry, rabbit, tmp_path):
    consumed_metadata.create_all(runtime.engine)
    runtime.settings.raw["CRONBOX_AMQP_URL"] = rabbit.url
    queue = rabbit.name("celery")
    rabbit.queues.append(queue)
    task = celery_task("cronbox_test.write", queue=queue, registry=registry)
    calls = tmp_path / "calls.txt"
    calls.touch()
    worker_env = child_env(env, TEST_CELERY_BROKER=rabbit.url, TEST_CELERY_DB=runtime.settings.database_url,
                           TEST_CALLS_FILE=str(calls), PYTHONPATH=str(APP_ROOT))
    return queue, task, calls, worker_env


def start_celery(worker_env: dict, queue: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.handlers.celery_app", "worker", "-P", "solo", "-Q", queue,
         "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "INFO", "-n", f"t{time.time_ns()}@test"],
        env=worker_env, cwd=str(APP_ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_calls(calls, count: int, worker: subprocess.Popen, seconds: float = 60) -> list:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines = calls.read_text().splitlines()
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        assert worker.poll() is None, worker.communicate()[0][-3000:]
        time.sleep(0.1)
    raise AssertionError(f"{len(calls.read_text().splitlines())} of {count} tasks ran")


def stop(worker: subprocess.Popen) -> str:
    worker.send_signal(signal.SIGTERM)
    return worker.communicate(timeout=60)[0]


def statuses(runtime) -> Counter:
    with runtime.sessions() as session:
        return Counter(session.scalars(select(J.c.status)))


def test_a_committed_dispatch_runs_once_in_celery_a_rolled_back_one_never(runtime, rabbit, celery_queue):
    queue, task, calls, worker_env = celery_queue
    with runtime.sessions() as session:  # the request's transaction
        task.dispatch(session, [1])
        task.dispatch(session, {"n": 2, "note": "kwargs"})
        session.commit()
    with runtime.sessions() as session:
        task.dispatch(session, [99])
        session.rollback()
    assert runtime.default_queues() == []  # the tick never runs them itself
    publisher = publish(runtime, rabbit.url)
    assert publisher.stats.published == 2
    assert statuses(runtime) == Counter({"done": 2})  # done at the broker's confirm: Celery has them
    # What Celery receives: protocol 2, the task's name, no arguments in the headers Celery shows.
    message = rabbit.channel.basic_get(queue, no_ack=False)
    headers = message.properties["application_headers"]
    assert headers["lang"] == "py" and headers["task"] == "cronbox_test.write" and headers["id"] == headers["root_id"]
    assert re.fullmatch(r"<cronbox job \d+>", headers["argsrepr"]) and headers["kwargsrepr"] == headers["argsrepr"]
    assert json.loads(message.body) == [[1], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    assert message.properties["correlation_id"] == headers["id"]
    rabbit.channel.basic_reject(message.delivery_tag, requeue=True)

    worker = start_celery(worker_env, queue)
    try:
        wait_for_calls(calls, 2, worker)
    finally:
        log = stop(worker)
    # No duplicate: every call the worker made, read once it has stopped, and nothing left on the broker
    # (what it had read and not run went back to the queue when it stopped), rather than whatever a
    # fixed second after the first two brought, which a loaded machine could pass before a copy ran.
    ran = [json.loads(line) for line in calls.read_text().splitlines()]
    assert sorted((n, note) for n, note, _id in ran) == [(1, None), (2, "kwargs")], log[-3000:]
    assert rabbit.channel.queue_declare(queue, passive=True).message_count == 0
    with runtime.sessions() as session:
        assert Counter(session.scalars(select(consumed.c.n))) == Counter({1: 1, 2: 1})
    assert "cronbox_test.write" in log and "succeeded" in log


def test_the_broker_down_for_a_while_delays_the_tasks_and_loses_none(runtime, rabbit, celery_queue):
    queue, task, calls, worker_env = celery_queue
    with runtime.sessions() as session:
        for n in range(3):
            task.dispatch(session, [n])
        session.commit()
    down = publish(runtime, url(rabbit.vhost, port=1))  # nothing listens there
    assert (down.stats.published, down.stats.failed) == (0, 3)
    assert statuses(runtime) == Counter({"reserved": 3})
    with runtime.sessions() as session:  # PUBLISH_RETRY has passed
        session.execute(update(J).values(available_at=clock.utcnow() - timedelta(seconds=1)))
        session.commit()
    back = publish(runtime, rabbit.url)
    assert back.stats.republished == 3 and statuses(runtime) == Counter({"done": 3})
    worker = start_celery(worker_env, queue)
    try:
        ran = wait_for_calls(calls, 3, worker)
    finally:
        stop(worker)
    assert sorted(n for n, _note, _id in ran) == [0, 1, 2]
    assert len({task_id for _n, _note, task_id in ran}) == 3
