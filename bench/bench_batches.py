"""Issue 39: what a batch's bookkeeping costs. 10,000 no-op jobs drained by `queue work --workers 2`,
as members of one batch and as plain jobs, in alternated rounds on one database (the machine is
shared and loaded: medians and spread, never one run). A member's ack raises its batch's counter once
per ack statement and checks for pending members under that row's lock; the bench shows InnoDB's row
lock waits of each drain (`SHOW GLOBAL STATUS LIKE 'Innodb_row_lock%'` deltas).

    .venv/bin/python -m bench.bench_batches --mysql mysql+pymysql://root:@127.0.0.1/ --rounds 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from sqlalchemy import func, select, text

import cronbox
from bench import quiet_handlers
from bench.bench_outbox import Target, child_env
from bench.report import write_section
from cronbox.outbox.queue.models import Job

N = 10_000


def fresh(t: Target, as_batch: bool) -> None:
    with t.runtime.engine.begin() as c:
        for table in ("cronbox_jobs", "cronbox_batches", "cronbox_job_results"):
            c.execute(text(f"DELETE FROM {table}"))
    with t.runtime.sessions.begin() as s:
        batch = cronbox.batch(s, name="bench") if as_batch else None
        for i in range(N):
            quiet_handlers.noop.dispatch(s, {"i": i}, batch=batch)


def lock_status(t: Target) -> dict[str, int]:
    if not t.url.startswith("mysql"):
        return {}
    with t.runtime.engine.connect() as c:
        return {name: int(value) for name, value in c.execute(text("SHOW GLOBAL STATUS LIKE 'Innodb_row_lock%'"))
                if name in ("Innodb_row_lock_waits", "Innodb_row_lock_time")}


def drain(t: Target, as_batch: bool) -> dict:
    fresh(t, as_batch)
    env = {**child_env(t), "CRONBOX_HANDLERS": "bench.quiet_handlers", "CRONBOX_LEASE_MARGIN": "5"}
    before = lock_status(t)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cronbox", "queue", "work", "--queue", quiet_handlers.QUEUE,
                           "--workers", "2", "--stop-when-empty"], env=env, cwd="/", capture_output=True, text=True)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    after = lock_status(t)
    with t.runtime.sessions() as s:
        done = s.scalar(select(func.count()).select_from(Job).where(Job.status == "done", Job.handler == "bench.quiet.noop"))
        first, last = s.execute(select(func.min(Job.reserved_at), func.max(Job.finished_at))
                                .where(Job.handler == "bench.quiet.noop")).one()
    assert done == N, f"{done} of {N} done"
    return {"drain": (last - first).total_seconds(), "wall": seconds,
            **{k: after[k] - before.get(k, 0) for k in after}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql", default=os.environ.get("TEST_MYSQL_URL"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    args = parser.parse_args()
    t = Target("mariadb" if args.mysql else "sqlite", args.mysql)
    runs: dict[str, list[dict]] = {"plain": [], "batch": []}
    try:
        for _ in range(args.rounds):  # alternated: the load moves, both see it
            for kind in ("plain", "batch"):
                runs[kind].append(drain(t, kind == "batch"))
                print(kind, runs[kind][-1], flush=True)
    finally:
        t.close()
    med = {k: statistics.median(r["drain"] for r in v) for k, v in runs.items()}
    rows = [f"| {k} | {med[k]:.2f} s ({min(r['drain'] for r in v):.2f}–{max(r['drain'] for r in v):.2f}) | "
            f"{N / med[k]:,.0f}/s | {statistics.median(r.get('Innodb_row_lock_waits', 0) for r in v):.0f} | "
            f"{statistics.median(r.get('Innodb_row_lock_time', 0) for r in v):.0f} ms |" for k, v in runs.items()]
    body = ("10,000 no-op jobs (`bench.quiet.noop`, no ctx.session: acks batched) drained by `queue work "
            f"--workers 2`, plain and as the members of one batch, {args.rounds} alternated rounds, medians "
            "(min–max); row lock waits and time: `Innodb_row_lock_waits` / `Innodb_row_lock_time` deltas of "
            "each drain.\n\n| jobs | drain | rate | row lock waits | row lock time |\n|---|---|---|---|---|\n"
            + "\n".join(rows) + f"\n\nBookkeeping: {100 * (med['batch'] / med['plain'] - 1):+.1f} % (the bar: ≤ 15 %).")
    print(body)
    if args.write:
        write_section("batches", "Issue 39: a batch's bookkeeping", "python -m bench.bench_batches --rounds "
                      f"{args.rounds}", body)


if __name__ == "__main__":
    main()
