"""Wake-up latency on PostgreSQL: a job committed → its body starts, cronbox against procrastinate.

    VENV=/tmp/bench-peers-venv; $VENV/bin/python bench/peers/wakeup.py [JOBS] [ROUNDS]

Both workers linger and listen: cronbox's `queue work --max-time` (LISTEN on a connection of its own,
outbox/core/notify.py, woken by migration 0012's trigger at COMMIT), procrastinate's `worker`
(`listen_notify` on, its default). Each round starts one worker of each, in turn (which goes first
alternates), waits until it has run a first job (it is listening then), and commits JOBS jobs one per
transaction, 60-140 ms apart (random, the same spacing for both), each job after the previous one ran.
A job's body writes the time it started; the latency is that less the time the producer's COMMIT
returned (one clock: the same machine). p50 and p99 a round; the table gives the median over rounds and
the spread. Needs procrastinate and psycopg (requirements-peers.txt) besides cronbox's requirements;
PostgreSQL on 127.0.0.1:5432 trusting `postgres` (databases `cronbox_wakebench` and procrastinate's
`bench` are made if missing).
"""
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.abspath(os.environ.get("CRONBOX_TREE") or os.path.dirname(os.path.dirname(HERE)))
sys.path[:0] = [TREE, HERE]
STARTS = os.environ.setdefault("WAKEUP_STARTS", tempfile.mkdtemp(prefix="cronbox-wakeup-"))
os.environ.setdefault("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/cronbox_wakebench")
os.environ.setdefault("CRONBOX_INSTANCE", STARTS)
os.environ["CRONBOX_HANDLERS"] = "wakeup"

import procrastinate  # noqa: E402

from cronbox import job  # noqa: E402


def _started(peer: str, seq: int) -> None:
    """The job body: when it started, in a file of its own (no database write to wait for)."""
    with open(os.path.join(STARTS, f"{peer}-{seq}"), "w") as f:
        f.write(repr(time.time()))


@job("wake", name="bench.wake", tries=1, timeout=30)
def cronbox_job(payload, ctx):
    _started("cronbox", payload["seq"])


app = procrastinate.App(connector=procrastinate.PsycopgConnector(
    conninfo="host=127.0.0.1 dbname=bench user=bench password=bench"))


@app.task(name="wake", queue="wake")
def procrastinate_job(seq):
    _started("procrastinate", seq)


class Cronbox:
    name = "cronbox"

    def __init__(self):
        import common
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        url = make_url(os.environ["DATABASE_URL"]).set(drivername="postgresql+psycopg")
        common.create_pg_database(url.database)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([TREE, HERE]))
        subprocess.run([sys.executable, "-m", "cronbox", "migrate"], check=True, stdout=subprocess.DEVNULL, env=env)
        self.engine = create_engine(url)
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM cronbox_jobs"))

    def argv(self):
        return [sys.executable, "-m", "cronbox", "queue", "work", "--queue", "wake", "--max-time", "600"]

    def enqueue(self, seq):
        from sqlalchemy.orm import Session

        with Session(self.engine) as session, session.begin():
            cronbox_job.dispatch(session, {"seq": seq})


class Procrastinate:
    name = "procrastinate"

    def __init__(self):
        import common

        common.create_pg_database("bench", owner="bench")
        app.open()
        connector = app.connector.get_sync_connector()
        if not connector.execute_query_one("SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS present")["present"]:
            app.schema_manager.apply_schema()
        connector.execute_query("DELETE FROM procrastinate_jobs WHERE queue_name = 'wake'")

    def argv(self):
        return [os.path.join(os.path.dirname(sys.executable), "procrastinate"), "--app", "wakeup.app",
                "--log-level", "warning", "worker", "--queues", "wake", "--concurrency", "1"]

    def enqueue(self, seq):
        procrastinate_job.defer(seq=seq)


def _wait_for(path, bound=60.0):
    end = time.monotonic() + bound
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit(f"no job start after {bound:.0f} s: {path}")
        time.sleep(0.002)
    for _ in range(100):  # written, not only created
        with open(path) as f:
            text = f.read()
        if text:
            return float(text)
        time.sleep(0.002)
    raise SystemExit(f"empty {path}")


def one_round(peer, jobs, spacing, first_seq):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TREE, HERE]))
    worker = subprocess.Popen(peer.argv(), env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        peer.enqueue(first_seq)  # warm-up: once it ran, the worker is up and listening
        _wait_for(os.path.join(STARTS, f"{peer.name}-{first_seq}"))
        latencies = []
        for i, gap in enumerate(spacing, start=first_seq + 1):
            time.sleep(gap)
            peer.enqueue(i)
            committed = time.time()
            latencies.append(_wait_for(os.path.join(STARTS, f"{peer.name}-{i}")) - committed)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        worker.stderr.close()
    latencies.sort()
    return latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


def main(jobs, rounds):
    peers = [Cronbox(), Procrastinate()]
    results = {p.name: [] for p in peers}
    seq = 0
    for r in range(rounds):
        spacing = [random.uniform(0.06, 0.14) for _ in range(jobs)]
        for peer in (peers if r % 2 == 0 else peers[::-1]):
            results[peer.name].append(one_round(peer, jobs, spacing, seq))
            seq += jobs + 1
            print(peer.name, "p50 %.1f ms, p99 %.1f ms" % tuple(x * 1000 for x in results[peer.name][-1]), flush=True)
    print(f"\n{jobs} jobs a round, {rounds} rounds; ms, median of rounds (min-max)\n")
    print("| worker | p50 | p99 |\n|---|---|---|")
    for name, rows in results.items():
        p50, p99 = [r[0] * 1000 for r in rows], [r[1] * 1000 for r in rows]
        print(f"| {name} | {statistics.median(p50):.1f} ({min(p50):.1f}-{max(p50):.1f}) "
              f"| {statistics.median(p99):.1f} ({min(p99):.1f}-{max(p99):.1f}) |")
    ratios = [c[0] / p[0] for c, p in zip(results["cronbox"], results["procrastinate"])]
    print(f"\np50 cronbox / procrastinate by round: {', '.join(f'{x:.2f}' for x in ratios)}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
