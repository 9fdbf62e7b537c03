"""A one-row job's whole path through RabbitMQ, cronbox beside Celery in one run (issue 28).

    python bench/bench_broker_jobs.py --tree TREE [--mysql mysql+pymysql://root:@127.0.0.1/test] \
        [--postgres postgresql://postgres@127.0.0.1:5432/postgres] [--store SQLite|MariaDB|PostgreSQL ...] \
        [--jobs 2000] [--rounds 3] [--variant cold|warm ...] [--amqp amqp://guest:guest@127.0.0.1:5672/]

N jobs, each writing one row to bench_floor_rows, in one fresh database per store (floor_host.Target,
migrated by the tree's `python -m cronbox migrate`):

cronbox: floor_handlers' `fl.jobwrite` (queue fl.jobs, `cronbox.forward_jobs` to this run's broker
queue) dispatched from this process in committed transactions of 100 (`.dispatch()` in the host's
own SQLAlchemy Session), then `python -m cronbox tick --no-linger` publishes them, and `python -m
cronbox amqp work --queue fl.jobs` runs them.

Celery: N `write_row.delay(i)` from this process (celery_bench_app.py: the same INSERT in its own
transaction; a fresh queue on the same RabbitMQ, acks_late, no result backend, prefetch 10), run by
`celery -A celery_bench_app worker -P solo -c 1 --without-gossip --without-mingle --without-heartbeat`.

Timed from the first dispatch / delay() to the last row written: this process polls COUNT(*) of
bench_floor_rows every 10 ms on one connection. Variants:
- cold: each worker starts after the dispatches (cronbox as the issue describes it: dispatch, the
  tick, then `amqp work --stop-when-empty`; Celery's worker started once the delay() calls returned):
  the workers' start-up is in the time;
- warm: each worker is up and consuming before the clock starts (`amqp work --max-jobs N`, the Celery
  worker), and the clock stops at the last row as before; cronbox's tick still starts inside the time
  (it is a cron process).
cronbox and Celery alternate, the order swapped every round; rates are the median of the rounds, the
spread their min-max. cronbox's path has database work Celery's has not (the job row's INSERT in
the caller's transaction, the tick's claim, the worker's take and token-guarded ack): a comparison,
not a target.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH / "peers")]

import floor_amqp  # noqa: E402
from bench_floors import alternate, spread  # noqa: E402  (one way to alternate rounds and show a spread)
from floor_host import Target  # noqa: E402
from sqlalchemy import text  # noqa: E402

POLL = 0.01
BATCH = 100
READY_TIMEOUT = 60.0


class Rows:
    """COUNT(*) of bench_floor_rows on one held connection, a fresh transaction each read."""

    def __init__(self, t: Target):
        self.connection = t.engine.connect()

    def count(self) -> int:
        n = self.connection.execute(text("SELECT COUNT(*) FROM bench_floor_rows")).scalar_one()
        self.connection.commit()
        return n

    def wait_for(self, n: int, processes: list[subprocess.Popen], timeout: float = 600) -> float:
        """Poll until n rows are there; the perf_counter then. A process that exits with an error ends it."""
        end = time.perf_counter() + timeout
        while True:
            if self.count() >= n:
                return time.perf_counter()
            for p in processes:
                if p.poll() not in (None, 0):
                    raise RuntimeError(f"{p.args} exited {p.returncode}")
            if time.perf_counter() > end:
                raise RuntimeError(f"not {n} rows after {timeout}s")
            time.sleep(POLL)

    def close(self) -> None:
        self.connection.close()


def start(argv: list[str], env: dict) -> subprocess.Popen:
    out = tempfile.TemporaryFile()
    process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    process.out = out  # type: ignore[attr-defined]
    return process


def finish(process: subprocess.Popen, *, stop: bool = False, timeout: float = 60) -> str:
    """Wait for the process (SIGTERM first if `stop`); its output; an error if it failed."""
    if stop and process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    process.out.seek(0)  # type: ignore[attr-defined]
    output = process.out.read().decode(errors="replace")  # type: ignore[attr-defined]
    process.out.close()  # type: ignore[attr-defined]
    if process.returncode not in (0, -signal.SIGTERM):
        raise RuntimeError(f"{process.args} exited {process.returncode}:\n{output[-3000:]}")
    return output


def wait_consumer(url: str, queue: str, process: subprocess.Popen) -> None:
    """Until the broker queue has a consumer (the worker is up), or the worker died."""
    end = time.perf_counter() + READY_TIMEOUT
    while time.perf_counter() < end:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited {process.returncode} before consuming:\n{finish(process)}")
        try:
            with floor_amqp.connect(url) as connection:
                if connection.channel().queue_declare(queue, passive=True).consumer_count:
                    return
        except Exception:
            pass  # not declared yet
        time.sleep(0.05)
    raise RuntimeError(f"no consumer on {queue} after {READY_TIMEOUT}s")


class Paths:
    """The two paths on one Target; each run returns the rate (jobs/s, first dispatch to last row)."""

    def __init__(self, t: Target, n: int, amqp_url: str, jobs_queue: str, celery_queue: str):
        from sqlalchemy.orm import Session  # noqa: F401  (imported before any clock starts)

        import celery_bench_app
        import floor_handlers
        import floor_sql

        self.t, self.n, self.amqp_url = t, n, amqp_url
        self.jobs_queue, self.celery_queue = jobs_queue, celery_queue
        self.job = floor_handlers.job_write
        self.task = celery_bench_app.write_row
        self.engine = floor_sql.engine_for(t.url)  # the host's engine, as floor_host's
        self.celery_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(BENCH / "peers")]),
                           "BENCH_CELERY_BROKER": amqp_url, "BENCH_CELERY_QUEUE": celery_queue,
                           "BENCH_CELERY_DB": t.url}
        self.celery_argv = [str(Path(sys.executable).with_name("celery")), "-A", "celery_bench_app", "worker",
                            "-P", "solo", "-c", "1", "-Q", celery_queue, "--without-gossip", "--without-mingle",
                            "--without-heartbeat", "-l", "WARNING"]
        self.cron_argv = [sys.executable, "-m", "cronbox"]

    def reset(self) -> None:
        self.t.reset()
        assert floor_amqp.purge(self.amqp_url, self.jobs_queue) == 0
        assert floor_amqp.purge(self.amqp_url, self.celery_queue) == 0

    def dispatch(self) -> None:
        from sqlalchemy.orm import Session

        for start_at in range(0, self.n, BATCH):
            with Session(self.engine) as s, s.begin():
                for i in range(start_at, min(self.n, start_at + BATCH)):
                    self.job.dispatch(s, {"i": i})

    def delay(self) -> None:
        for i in range(self.n):
            self.task.delay(i)

    def cronbox(self, warm: bool) -> float:
        self.reset()
        rows = Rows(self.t)
        try:
            worker = None
            if warm:
                worker = start([*self.cron_argv, "amqp", "work", "--queue", "fl.jobs", "--max-jobs", str(self.n)],
                               self.t.env)
                wait_consumer(self.amqp_url, self.jobs_queue, worker)
            started = time.perf_counter()
            self.dispatch()
            self.t.cron(["tick", "--no-linger"])
            if worker is None:
                worker = start([*self.cron_argv, "amqp", "work", "--queue", "fl.jobs", "--stop-when-empty"],
                               self.t.env)
            ended = rows.wait_for(self.n, [worker])
            finish(worker)
        finally:
            rows.close()
        assert self.t.count("cronbox_jobs", "status = 'done'") == self.n
        return self.n / (ended - started)

    def celery(self, warm: bool) -> float:
        self.reset()
        rows = Rows(self.t)
        try:
            worker = None
            if warm:
                worker = start(self.celery_argv, self.celery_env)
                wait_consumer(self.amqp_url, self.celery_queue, worker)
            started = time.perf_counter()
            self.delay()
            if worker is None:
                worker = start(self.celery_argv, self.celery_env)
            ended = rows.wait_for(self.n, [worker])
            finish(worker, stop=True)
        finally:
            rows.close()
        assert self.t.count("bench_floor_rows") == self.n
        return self.n / (ended - started)

    def close(self) -> None:
        self.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, help="the cronbox tree to measure (put first on sys.path)")
    parser.add_argument("--mysql", default=os.environ.get("TEST_MYSQL_URL"))
    parser.add_argument("--postgres", "--postgresql", default=os.environ.get("TEST_POSTGRES_URL"))
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--store", action="append", choices=["SQLite", "MariaDB", "PostgreSQL"])
    parser.add_argument("--variant", action="append", choices=["cold", "warm"])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    servers = {"SQLite": None, "MariaDB": args.mysql, "PostgreSQL": args.postgres}
    stores = [s for s in (args.store or list(servers)) if s == "SQLite" or servers[s]]
    variants = args.variant or ["cold", "warm"]
    tree = str(Path(args.tree).resolve())
    prefix = f"cronbox-bbj-{secrets.token_hex(4)}"
    jobs_queue, celery_queue = prefix + ".jobs", prefix + ".celery"
    # This process dispatches: cronbox from the tree, floor_handlers' forwarded queue on the run's broker queue.
    os.environ.update({"FLOOR_JOBS_QUEUE": jobs_queue, "FLOOR_AMQP_URL": args.amqp, "CRONBOX_AMQP_URL": args.amqp,
                       "BENCH_CELERY_BROKER": args.amqp, "BENCH_CELERY_QUEUE": celery_queue})
    sys.path.insert(0, tree)
    floor_amqp.declare_queue(args.amqp, jobs_queue)
    floor_amqp.declare_queue(args.amqp, celery_queue)
    rows = []
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, tree {tree}, {args.jobs:,} jobs, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    try:
        for store in stores:
            t = Target(tree, servers[store], {"FLOOR_JOBS_QUEUE": jobs_queue, "CRONBOX_AMQP_URL": args.amqp})
            paths = Paths(t, args.jobs, args.amqp, jobs_queue, celery_queue)
            try:
                for variant in variants:
                    warm = variant == "warm"
                    ours, theirs = alternate(args.rounds, lambda: paths.cronbox(warm), lambda: paths.celery(warm))
                    ratio = statistics.median(ours) / statistics.median(theirs)
                    row = (f"| {variant} | {store} | {statistics.median(ours):,.0f}/s | {statistics.median(theirs):,.0f}/s "
                           f"| {ratio:.2f}× | {spread(ours)} | {spread(theirs)} |")
                    rows.append(row)
                    print(row, flush=True)
            finally:
                paths.close()
                t.close()
    finally:
        floor_amqp.delete_queue(args.amqp, jobs_queue)
        floor_amqp.delete_queue(args.amqp, celery_queue)
        with floor_amqp.connect(args.amqp) as connection:
            connection.channel().exchange_delete(celery_queue)  # Celery's direct exchange, named after its queue
    print(f"load {os.getloadavg()[0]:.1f}\n\n| workers | store | cronbox | Celery | ratio | cronbox min-max | "
          f"Celery min-max |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
