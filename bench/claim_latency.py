"""One job's claim on PostgreSQL, in-process: cronbox's claim transaction against one statement.

    .venv/bin/python -m bench.claim_latency [--postgres postgresql://postgres@127.0.0.1:5432/postgres]
        [--jobs 300] [--rounds 3]

A worker woken by NOTIFY starts its job one claim after the wake-up, so the claim is what the wake-up
costs beyond the wait (bench/peers/wakeup.py measures the whole). Each sample commits one due job,
then times a claim of its queue: cronbox's (`jobstore.claim_due` in a transaction of the worker's
kind, as `queue work` claims) and, alternated with it, the floor: procrastinate's shape of fetch, one
`UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING *` in autocommit,
through SQLAlchemy's public `Connection.execute`, on the same server and table. Medians of each round,
in ms, and their ratio. Run it from another checkout (PYTHONPATH=<tree>) to compare trees.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from cronbox.outbox.core import clock
from cronbox.outbox.core.migrate import upgrade
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.jobs import job

DATABASE = "cronbox_claimbench"
# The times are bound from the same UTC clock as cronbox's (its columns hold naive UTC), not the server's
# now(), which follows its TimeZone setting.
FLOOR = text(
    "UPDATE cronbox_jobs SET status = 'reserved', claim_token = md5(random()::text), attempts = attempts + 1, "
    "reserved_at = :now, available_at = :lease "
    "WHERE id = (SELECT id FROM cronbox_jobs WHERE queue = 'wake' AND status = 'ready' AND available_at <= :now "
    "ORDER BY available_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING *")


def round_of(runtime: Runtime, registry: Registry, wake, floor, jobs: int) -> tuple[float, float]:
    mode, margin = runtime.claim_mode(), runtime.settings.lease_margin

    def claim(session):
        now = clock.utcnow()
        for queue in jobstore.due_queues(session, registry.jobs, ["wake"], now):
            claimed = jobstore.claim_due(session, registry.jobs, queue, now=now, limit=100, mode=mode,
                                         lease_margin=margin)
            if claimed:
                return claimed
        return []

    ours, theirs = [], []
    for n in range(jobs):
        with runtime.sessions.begin() as session:
            wake.dispatch(session, {"n": n})
        started = time.perf_counter()
        claimed = in_transaction(runtime.sessions, claim)
        ours.append(time.perf_counter() - started)
        assert len(claimed) == 1
        with runtime.sessions.begin() as session:
            wake.dispatch(session, {"n": n})
        now = clock.utcnow()
        started = time.perf_counter()
        floor.execute(FLOOR, {"now": now, "lease": now + timedelta(hours=1)}).one()
        theirs.append(time.perf_counter() - started)
    return statistics.median(ours) * 1000, statistics.median(theirs) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=os.environ.get("TEST_POSTGRES_URL")
                        or "postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        connection.execute(text(f"CREATE DATABASE {DATABASE}"))
    url = make_url(args.postgres).set(database=DATABASE).render_as_string(hide_password=False)
    settings = load_settings(environ={"DATABASE_URL": url, "CRONBOX_HANDLERS": "",
                                      "CRONBOX_INSTANCE": tempfile.mkdtemp(prefix="cronbox-claimbench-")})
    registry = Registry()
    runtime = Runtime(settings, registry=registry)
    floor_engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        upgrade(settings, runtime.engine)

        @job("wake", name="bench.wake", timeout=3600, registry=registry)  # no lease runs out during the run
        def wake(payload, ctx):
            pass

        with floor_engine.connect() as floor:
            for number in range(1, args.rounds + 1):
                ours, theirs = round_of(runtime, registry, wake, floor, args.jobs)
                print(f"round {number}: cronbox's claim p50 {ours:.2f} ms, one statement {theirs:.2f} ms, "
                      f"{ours / theirs:.2f}x", flush=True)
    finally:
        runtime.dispose()
        floor_engine.dispose()
        with admin.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        admin.dispose()


if __name__ == "__main__":
    main()
