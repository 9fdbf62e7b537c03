"""Jobs run off RabbitMQ by the `amqp work` tests (CRONBOX_HANDLERS=tests.handlers.broker_jobs).

Three queues, "sms", "mail" and "report" (and "<TEST_BROKER_PREFIX>-celery", Celery's), forwarded (cronbox.forward_jobs) to the broker queues
"<TEST_BROKER_PREFIX>.<queue>", republished after TEST_REPUBLISH_AFTER seconds (default 60). Each
queue's job writes a test_consumed row (consumer = the queue, n = the payload's "n": its database
effect, in the job's transaction) and appends "<queue> <n> <attempt>" to TEST_CALLS_FILE (an outside
effect, at least once). What a call does comes from the payload:
  "fail": N    fails its first N attempts
And on "sms": "broker.held" (timeout 120 s), the same job after it writes TEST_INSIDE_FILE and waits
for TEST_RELEASE_FILE (tests.handlers.effects.wait_for_release), so that a test signals its worker
while it runs, however slow the machine; "broker.poison" (tries 2, timeout 2 s), which SIGKILLs its
own process, as a job that runs a worker out of memory does.
"""
from __future__ import annotations

import os
import signal
import time
from sqlalchemy import insert

import cronbox
from tests.handlers.consuming import consumed
from tests.handlers.effects import wait_for_release

QUEUES = ("sms", "mail", "report")
_prefix = os.environ.get("TEST_BROKER_PREFIX", "cronbox-test")
_republish = float(os.environ.get("TEST_REPUBLISH_AFTER", "60"))
for _queue in QUEUES:
    cronbox.forward_jobs(_queue, broker_queue=f"{_prefix}.{_queue}", republish_after=_republish)
if os.environ.get("TEST_SHARED_BROKER_QUEUE"):  # a fourth queue, whose messages go to mail's broker queue too
    cronbox.forward_jobs("digest", broker_queue=f"{_prefix}.mail", republish_after=_republish)
# A task of the user's Celery, on a queue forwarded as Celery task messages: `amqp work` refuses that queue.
CELERY_QUEUE = f"{_prefix}-celery"
cronbox.celery_task("reports.build", queue=CELERY_QUEUE)


def _run(queue: str, payload, ctx) -> None:
    calls = os.environ.get("TEST_CALLS_FILE")
    if calls:
        with open(calls, "a") as out:
            out.write(f"{queue} {payload['n']} {ctx.attempt}\n")
    ctx.session.execute(insert(consumed).values(consumer=queue, n=payload["n"], attempt=ctx.attempt, at=time.time()))
    if ctx.attempt <= payload.get("fail", 0):
        raise RuntimeError(f"failing attempt {ctx.attempt}")


@cronbox.job("sms", name="broker.sms", tries=5, backoff=[0.2, 0.5], timeout=10)
def sms(payload, ctx):
    _run("sms", payload, ctx)


@cronbox.job("mail", name="broker.mail", tries=5, backoff=[0.2, 0.5], timeout=10)
def mail(payload, ctx):
    _run("mail", payload, ctx)


@cronbox.job("report", name="broker.report", tries=5, backoff=[0.2, 0.5], timeout=10)
def report(payload, ctx):
    _run("report", payload, ctx)


@cronbox.job("sms", name="broker.held", tries=5, timeout=120)
def held(payload, ctx):
    wait_for_release()
    _run("sms", payload, ctx)


@cronbox.job("sms", name="broker.poison", tries=2, timeout=2)
def poison(payload, ctx):
    os.kill(os.getpid(), signal.SIGKILL)
