"""Consumers and jobs of the floor benchmarks (CRONBOX_HANDLERS=floor_handlers).

Imported by cronbox from the tree under test (bench_floors puts that tree first on sys.path), so it
uses only cronbox's public decorators. Each body is what its floor in floor_sql.py does by hand."""
from __future__ import annotations

import os

from sqlalchemy import text

import cronbox
from common import bump  # bench/peers/common.py: the peer harness's job body

# One row through ctx.session, committed with the ack (floor_sql.ROW_INSERT is the same statement).
ROW_INSERT = text("INSERT INTO bench_floor_rows (event_id, note) VALUES (:event_id, 'x')")


@cronbox.consumer("fl.noop", name="fl.noop")
def noop(event, ctx):
    """Nothing: what is left is cronbox's own work (claim, call, ack)."""


@cronbox.consumer("fl.write", name="fl.write")
def write(event, ctx):
    ctx.session.execute(ROW_INSERT, {"event_id": event.id})


@cronbox.consumer("fl.gwrite", name="fl.gwrite", grouped=True)
def write_grouped(event, ctx):
    ctx.session.execute(ROW_INSERT, {"event_id": event.id})


@cronbox.job("bench", name="fl.bump", tries=3, timeout=30)
def peer_body(payload, ctx):
    bump()


@cronbox.job("bench", name="fl.noopjob", tries=3, timeout=30)
def noop_job(payload, ctx):
    """Nothing."""


if os.environ.get("FLOOR_EXCHANGE"):
    cronbox.forward("fl.fwd", exchange=os.environ["FLOOR_EXCHANGE"], name="fl.amqp")

if os.environ.get("FLOOR_CONSUME"):
    @cronbox.consumer("fl.cwrite", name="fl.cwrite")
    def consume_write(event, ctx):
        """`amqp consume`'s handler: the one row (floor_amqp.bare_consumer writes the same)."""
        ctx.session.execute(ROW_INSERT, {"event_id": int(event.payload["i"])})


# Jobs on RabbitMQ (issue 28): queue "fl.jobs" forwarded (cronbox.forward_jobs) to the run's own
# broker queue, for bench_floors' jobs-publish and jobs-work; its job writes the one row.
JOBS_QUEUE = "fl.jobs"
if os.environ.get("FLOOR_JOBS_QUEUE"):
    cronbox.forward_jobs(JOBS_QUEUE, broker_queue=os.environ["FLOOR_JOBS_QUEUE"])

    @cronbox.job(JOBS_QUEUE, name="fl.jobwrite", tries=3, timeout=30)
    def job_write(payload, ctx):
        """The one row through ctx.session, committed with the job's ack (floor_amqp.jobs_work writes the same)."""
        ctx.session.execute(ROW_INSERT, {"event_id": payload["i"]})
