"""Worker pool benchmark: drain throughput of `queue work --workers 1, 2, 4 --stop-when-empty`.

    .venv/bin/python -m bench.bench_pool [--mysql mysql+pymysql://root:@127.0.0.1/test] [--size 5000] [--runs 3]

The job body is the peer harness's (one autocommit UPDATE on its own MariaDB connection, as in
bench_queue and bench/peers). One process is started per run: `--workers 1` is the plain in-process
worker, 2 and 4 the pool (a parent forking that many children). The drain rate is jobs / (last
finished_at - first reserved_at) as the workers recorded them; the wall time includes start-up and the
pool's forks. Ratios are to `--workers 1` measured in the same run. Rewrites the "Worker pool" section
of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from sqlalchemy import func, select, text

from bench import handlers
from bench.bench_outbox import Target, child_env
from bench.bench_queue import bulk_dispatch, prepare_counter
from bench.report import write_section
from cronbox.outbox.queue.models import Job

WORKERS = (1, 2, 4)


def drain(t: Target, n: int, workers: int) -> dict:
    with t.runtime.engine.begin() as c:
        c.execute(text("DELETE FROM cronbox_jobs"))
    bulk_dispatch(t, handlers.job_bump, n)
    t.runtime.engine.dispose()
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cronbox", "queue", "work", "--queue", "bench", "--stop-when-empty",
                           "--workers", str(workers)], env=child_env(t), cwd="/", capture_output=True, text=True)
    wall = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with t.runtime.sessions() as s:
        done = s.scalar(select(func.count()).select_from(Job).where(Job.status == "done"))
        first, last = s.execute(select(func.min(Job.reserved_at), func.max(Job.finished_at))).one()
    assert done == n, f"{done} of {n} done: {proc.stdout}"
    return {"rate": n / (last - first).total_seconds(), "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql", default=os.environ.get("TEST_MYSQL_URL"))
    parser.add_argument("--size", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    prepare_counter()
    loads = [os.getloadavg()[0]]
    rows = []
    for label, url in [("SQLite", None)] + ([("MariaDB", args.mysql)] if args.mysql else []):
        t = Target(label, url)
        try:
            results = {w: [] for w in WORKERS}
            for _ in range(args.runs):  # interleaved: the machine's load drifts alike for each size
                for workers in WORKERS:
                    results[workers].append(drain(t, args.size, workers))
                    loads.append(os.getloadavg()[0])
            base = statistics.median(r["rate"] for r in results[1])
            for workers in WORKERS:
                rates = [r["rate"] for r in results[workers]]
                rate = statistics.median(rates)
                wall = statistics.median(r["wall"] for r in results[workers])
                rows.append((label, workers, f"{rate:,.0f} ({min(rates):,.0f}-{max(rates):,.0f})",
                             f"{rate / base:.2f}", f"{wall:.2f}"))
                print(label, workers, f"{rate:,.0f}/s", f"x{rate / base:.2f}", f"wall {wall:.2f}s", flush=True)
        finally:
            t.close()
    table = (f"| store | --workers | drain {args.size:,} peer-body jobs (jobs/s, median (min-max of {args.runs})) "
             "| ratio to --workers 1 | wall time incl. start-up (s) |\n|---|---|---|---|---|\n")
    table += "\n".join(f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows) + "\n"
    table += f"\nLoad average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores.\n"
    print(table)
    command = "python -m bench.bench_pool" + (" --mysql mysql+pymysql://root:@127.0.0.1/test" if args.mysql else "")
    write_section("pool", "Worker pool", command, table + NOTES)


NOTES = """
Each pool child claims batches of 20 (`JOBS_PER_WORKER` in `outbox/queue/pool.py`) where a lone worker
claims 100, so the backlog is shared rather than leased by the first child. The peer body waits on
MariaDB (an autocommit UPDATE flushed to disk), which is where extra workers help; its UPDATEs all hit
one counter row and serialise on its row lock, and every claim and ack is a write (on SQLite, one
`BEGIN IMMEDIATE` writer at a time), so the gain per worker is well below linear. The machine has two
cores shared by the workers, MariaDB and whatever else runs: the load average printed above says how
busy it was, and the rates of a busy run are far below the "Job queue" section's. A body waiting on the
network (SMS, e-mail providers) gains more per worker; CRONBOX_MAX_CONNECTIONS is the other limit.
"""

if __name__ == "__main__":
    main()
