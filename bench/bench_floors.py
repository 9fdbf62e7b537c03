"""cronbox next to its public-API floor, per path, in one run (issue 25's targets are these ratios).

    python bench/bench_floors.py --tree /work/main --label main --mysql mysql+pymysql://root:@127.0.0.1/test \
        [--postgres postgresql://postgres@127.0.0.1:5432/postgres] [--store SQLite|MariaDB|PostgreSQL ...] \
        [--section record|dispatch|drain|relay|forward|consume|jobs-publish|jobs-work|drain-noop|relay-noop ...] \
        [--rounds 3] [--items N] \
        [--amqp amqp://guest:guest@127.0.0.1:5672/] [--before REV]

cronbox runs from the tree given (`--tree`, first on the child's sys.path) as a user runs it: record and
dispatch in the host's own SQLAlchemy Session, `python -m cronbox tick --no-linger`, `queue work
--stop-when-empty`, `amqp consume --max-messages N` and `amqp work --max-jobs N` as subprocesses timed start to exit
(floor_host.py). Each floor (floor_sql.py, floor_amqp.py) is the same statements and messages through
SQLAlchemy and py-amqp's public calls, as a subprocess timed the same way, with no cronbox. The two
alternate, order swapped every round, on the same fresh database; rates are the median of the rounds,
the spread their min-max. Prints one markdown table row per measurement. `--before REV` measures the code
at that commit too (`git archive REV`, unpacked in a temporary folder, as bench_ack_flush does), in the
same run: each round runs the section once per tree, the trees' order swapped every round, on the same
database; each tree's rows are the medians of its rounds. On PostgreSQL (`--postgres`, a
server URL: each section gets a database of its own there) the drain's peer-body rows need `--mysql` too:
that body bumps the harness's counter in MariaDB whatever cronbox's store. `drain-noop` and `relay-noop`
are the no-op CPU rows of `drain` and `relay` alone (issue 41's own-CPU target).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent / "peers")]

import common  # noqa: E402  bench/peers/common.py: the peer job body's counter
import floor_amqp  # noqa: E402
from floor_host import Target  # noqa: E402

TARGETS = {"db": 0.85, "broker": 0.75}
OWN_TIME = re.compile(r" in ([0-9.]+)s")
COUNTER = "floor"


class Report:
    """Markdown rows: path, store, tree, cronbox, floor, ratio, spreads, target. The measurements of a
    path accumulate (a section run once per round, with --before), each row made of all of them."""

    def __init__(self, label: str):
        self.label = label
        self.measured: dict[tuple[str, str], dict] = {}  # (path, store) -> kind, target, unit, ours, floor

    def rate(self, path: str, store: str, ours: list[float], floor: list[float], target: str, unit: str = "/s"):
        self._add("rate", path, store, ours, floor, target, unit)

    def cpu(self, path: str, store: str, ours: list[float], floor: list[float]) -> None:
        """CPU µs per item of cronbox's process and of the floor's, by rounds (cronbox's own: the difference)."""
        self._add("cpu", path, store, ours, floor, "own ≤50 µs", " µs")

    def _add(self, kind, path, store, ours, floor, target, unit) -> None:
        entry = self.measured.setdefault((path, store), {"kind": kind, "target": target, "unit": unit,
                                                         "ours": [], "floor": []})
        entry["ours"] += ours
        entry["floor"] += floor
        print(self.row(path, store, entry), flush=True)

    def row(self, path: str, store: str, entry: dict) -> str:
        ours, floor, unit = entry["ours"], entry["floor"], entry["unit"]
        if entry["kind"] == "cpu":
            own = [x - y for x, y in zip(ours, floor)]
            path = (f"{path}: CPU µs per item (cronbox's own: {statistics.median(own):.0f} µs, "
                    f"{min(own):.0f}-{max(own):.0f})")
            ratio = ""
        else:
            ratio = f"{statistics.median(ours) / statistics.median(floor):.2f}×"
        cells = (path, store, self.label, f"{statistics.median(ours):,.0f}{unit}", f"{statistics.median(floor):,.0f}{unit}",
                 ratio, spread(ours), spread(floor), entry["target"])
        return "| " + " | ".join(str(c) for c in cells) + " |"

    @property
    def rows(self) -> list[str]:
        return [self.row(path, store, entry) for (path, store), entry in self.measured.items()]

    def markdown(self) -> str:
        return ("| path | store | tree | cronbox | floor | ratio | cronbox min-max | floor min-max | target |\n"
                "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(self.rows))


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}"


def alternate(rounds: int | range, ours, floor) -> tuple[list, list]:
    """Each round runs both, the order swapped every round (the machine's load moves between runs).
    `rounds`: how many, or which (a range: the rounds of a longer run, their order kept)."""
    a, b = [], []
    for r in (rounds if isinstance(rounds, range) else range(rounds)):
        if r % 2 == 0:
            a.append(ours())
            b.append(floor())
        else:
            b.append(floor())
            a.append(ours())
    return a, b


def section_record(t: Target, store: str, table: Report, rounds: int, kind: str, n: int = 2000) -> None:
    def ours():
        t.reset()
        return n / t.host([kind, str(n)])["seconds"]

    def floor():
        t.reset()
        return n / t.floor("floor_sql.py", [kind, str(n)])["seconds"]

    a, b = alternate(rounds, ours, floor)
    what = "cronbox.record()" if kind == "record" else "job.dispatch()"
    table.rate(f"{kind}: {what}, one row per transaction", store, a, b, "≥0.85×")


WORK = ["queue", "work", "--queue", "bench", "--stop-when-empty"]


def section_drain(t: Target, store: str, table: Report, rounds: int, peer_db: bool, n: int = 5000) -> None:
    env_counter(t)
    if peer_db:  # the peer body bumps a counter in MariaDB, whatever cronbox's store
        def ours():
            t.fresh("seed-jobs", "peer_body", n)
            result = t.cron(WORK)
            assert t.count("cronbox_jobs", "status = 'done'") == n, result
            return n / result["wall"]

        def floor():
            t.fresh("seed-jobs", "peer_body", n)
            return n / t.floor("floor_sql.py", ["drain-peer", str(n)], {"BENCH_COUNTER": COUNTER})["wall"]

        a, b = alternate(rounds, ours, floor)
        table.rate(f"drain: `queue work --stop-when-empty`, {n:,} jobs of the peer body, start to exit", store, a, b,
                   "≥0.85×")

    section_drain_noop(t, store, table, rounds, n)


def section_drain_noop(t: Target, store: str, table: Report, rounds: int, n: int = 5000) -> None:
    """The drain's no-op jobs: CPU per item (also a section of its own, `drain-noop`)."""
    def noop_ours(k):
        t.fresh("seed-jobs", "noop_job", k)
        return t.cron(WORK)

    def noop_floor(k):
        t.fresh("seed-jobs", "noop_job", k)
        return t.floor("floor_sql.py", ["drain-noop", str(k)])

    cpu_per_item(store, table, rounds, n, "drain: no-op jobs", noop_ours, noop_floor)


def cpu_per_item(store, table, rounds, n, path, ours, floor) -> None:
    """CPU µs per item of a process doing n items, less the same process doing none (its start-up)."""
    def per_item(run):
        return (run(n)["cpu"] - run(0)["cpu"]) / n * 1e6

    a, b = alternate(rounds, lambda: per_item(ours), lambda: per_item(floor))
    table.cpu(f"{path}, {n:,}", store, a, b)


TICK_MAX_TIME = "600"  # the default 55 s cuts a tick short on a loaded machine, and its rows would not add up


def tick(t: Target) -> dict:
    result = t.cron(["tick", "--no-linger", "--max-time", TICK_MAX_TIME])
    result["own"] = float(OWN_TIME.search(result["stdout"]).group(1))
    return result


def section_relay(t: Target, store: str, table: Report, rounds: int, n: int = 2000) -> None:
    for consumer, kind, title in (("fl.write", "relay-write", "one-row consumer"),
                                  ("fl.gwrite", "relay-gwrite", "one-row consumer, grouped=True")):
        own, floor_own = [], []

        def ours():
            t.fresh("seed-events", consumer, n)
            result = tick(t)
            assert t.count("bench_floor_rows") == n, result
            own.append(n / result["own"])
            return n / result["wall"]

        def floor():
            t.fresh("seed-events", consumer, n)
            result = t.floor("floor_sql.py", [kind, str(n)])
            floor_own.append(n / result["seconds"])
            return n / result["wall"]

        a, b = alternate(rounds, ours, floor)
        table.rate(f"relay: `tick --no-linger`, {n:,} events to a {title}, start to exit", store, a, b, "≥0.85×")
        table.rate(f"relay: {title}, the tick's own reported time / the floor's loop", store, own, floor_own, "")
    section_relay_noop(t, store, table, rounds)


def section_relay_noop(t: Target, store: str, table: Report, rounds: int, n: int = 5000) -> None:
    """The relay to a no-op consumer: CPU per item (also a section of its own, `relay-noop`)."""
    def noop_ours(k):
        t.fresh("seed-events", "fl.noop", k)
        return tick(t)

    def noop_floor(k):
        t.fresh("seed-events", "fl.noop", k)
        return t.floor("floor_sql.py", ["relay-noop", str(k)])

    cpu_per_item(store, table, rounds, n, "relay: `tick` to a no-op consumer", noop_ours, noop_floor)


def section_forward(t: Target, store: str, table: Report, rounds: int, broker: dict, n: int = 10000) -> None:
    own, bare = [], []

    def ours():
        t.fresh("seed-events", "fl.fwd", n)
        result = tick(t)
        assert floor_amqp.purge(broker["FLOOR_AMQP_URL"], broker["FLOOR_QUEUE"]) == n, result
        own.append(n / result["own"])
        return n / result["wall"]

    def floor():
        t.fresh("seed-events", "fl.fwd", n)
        result = t.floor("floor_amqp.py", ["forward", str(n)], broker)
        assert floor_amqp.purge(broker["FLOOR_AMQP_URL"], broker["FLOOR_QUEUE"]) == n
        # The bare publisher in the same minute: no database, the same messages and batches.
        published = t.floor("floor_amqp.py", ["publish", str(n)], broker)
        assert floor_amqp.purge(broker["FLOOR_AMQP_URL"], broker["FLOOR_QUEUE"]) == n
        bare.append(n / published["wall"])
        return n / result["wall"]

    a, b = alternate(rounds, ours, floor)
    table.rate(f"forward: `tick --no-linger`, {n:,} keyless events to RabbitMQ, start to exit", store, a, b,
               "≥0.75×")
    table.rate("forward: the same tick / the bare py-amqp publisher (no database), start to exit", store, a, bare, "")
    table.rate("forward: the tick's own reported time / the bare publisher", store, own, bare, "")


def section_consume(t: Target, store: str, table: Report, rounds: int, broker: dict, n: int = 2000) -> None:
    own = []

    def ours():
        t.reset()
        t.floor("floor_amqp.py", ["fill", str(n)], broker)
        result = t.cron(["amqp", "consume", "--queue", broker["FLOOR_QUEUE"], "--max-messages", str(n)])
        assert t.count("bench_floor_rows") == n, result
        own.append(n / float(OWN_TIME.search(result["stdout"]).group(1)))
        return n / result["wall"]

    def floor():
        t.reset()
        t.floor("floor_amqp.py", ["fill", str(n)], broker)
        result = t.floor("floor_amqp.py", ["consume", str(n)], broker)
        assert t.count("bench_floor_rows") == n
        return n / result["wall"]

    a, b = alternate(rounds, ours, floor)
    table.rate(f"consume: `amqp consume --max-messages {n:,}` (prefetch 10), one-row consumer, start to exit", store,
               a, b, "≥0.75×")
    table.rate("consume: its own reported time / the bare consumer, start to exit", store, own, b, "")


JOBS = ["--queue", "fl.jobs"]  # floor_handlers' forwarded queue (FLOOR_JOBS_QUEUE its broker queue)


def section_jobs_publish(t: Target, store: str, table: Report, rounds: int, broker: dict, n: int = 10000) -> None:
    """Issue 28: the tick's job publisher (claim, publish with confirms, extend the lease) against
    floor_amqp's jobs-publish (its statements and messages by hand) and the bare publisher."""
    url, queue = broker["FLOOR_AMQP_URL"], broker["FLOOR_JOBS_QUEUE"]
    own, floor_own, bare = [], [], []

    def ours():
        t.fresh("seed-numbered-jobs", "job_write", n)
        result = tick(t)
        assert floor_amqp.purge(url, queue) == n, result
        assert t.count("cronbox_jobs", "status = 'reserved'") == n, result
        own.append(n / result["own"])
        return n / result["wall"]

    def floor():
        t.fresh("seed-numbered-jobs", "job_write", n)
        result = t.floor("floor_amqp.py", ["jobs-publish", str(n)], broker)
        assert floor_amqp.purge(url, queue) == n
        floor_own.append(n / result["seconds"])
        # The bare publisher in the same minute: no database, the same messages and batches.
        published = t.floor("floor_amqp.py", ["jobs-bare", str(n)], broker)
        assert floor_amqp.purge(url, queue) == n
        bare.append(n / published["wall"])
        return n / result["wall"]

    a, b = alternate(rounds, ours, floor)
    table.rate(f"jobs-publish: `tick --no-linger`, {n:,} jobs of a forwarded queue to RabbitMQ, start to exit", store,
               a, b, "≥0.75×")
    table.rate("jobs-publish: the tick's own reported time / the floor's loop (start-up left out of both)", store, own,
               floor_own, "")
    table.rate("jobs-publish: the same tick / the bare py-amqp publisher (no database), start to exit", store, a, bare,
               "")


def section_jobs_work(t: Target, store: str, table: Report, rounds: int, broker: dict, n: int = 2000) -> None:
    """Issue 28: `amqp work` running one-row jobs off the broker against floor_amqp's jobs-work (a
    bare py-amqp consumer doing the same take, write and ack)."""
    url, queue = broker["FLOOR_AMQP_URL"], broker["FLOOR_JOBS_QUEUE"]
    own, floor_own = [], []

    def fill():
        """n jobs dispatched, then published by a tick (untimed): n job messages on the broker."""
        t.fresh("seed-numbered-jobs", "job_write", n)
        tick(t)
        assert floor_amqp.count(url, queue) == n

    def check(result):
        assert t.count("bench_floor_rows") == n and t.count("cronbox_jobs", "status = 'done'") == n, result
        assert floor_amqp.purge(url, queue) == 0, result

    def ours():
        fill()
        result = t.cron(["amqp", "work", *JOBS, "--max-jobs", str(n)])
        check(result)
        own.append(n / float(OWN_TIME.search(result["stdout"]).group(1)))
        return n / result["wall"]

    def floor():
        fill()
        result = t.floor("floor_amqp.py", ["jobs-work", str(n)], broker)
        check(result)
        floor_own.append(n / result["seconds"])
        return n / result["wall"]

    a, b = alternate(rounds, ours, floor)
    table.rate(f"jobs-work: `amqp work --max-jobs {n:,}` (prefetch 10), one-row jobs, start to exit", store, a, b,
               "≥0.75×")
    table.rate("jobs-work: its own reported time / the bare consumer's loop (start-up left out of both)", store, own,
               floor_own, "")


def env_counter(t: Target) -> None:
    t.env["BENCH_COUNTER"] = COUNTER
    with common.connect() as db:
        common.reset_counter(db, COUNTER)


SECTIONS = ("record", "dispatch", "drain", "relay", "forward", "consume", "jobs-publish", "jobs-work", "drain-noop",
            "relay-noop")


def unpack(rev: str) -> str:
    """The code at `rev` as files in a temporary folder (no worktree, no change to the repository)."""
    into = tempfile.mkdtemp(prefix="cronbox-floor-before-")
    archive = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "archive", rev],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def run_section(section: str, t: Target, store: str, table: Report, rounds: int | range, args, size: dict,
                broker: dict, jobs_broker: dict) -> None:
    if section in ("record", "dispatch"):
        section_record(t, store, table, rounds, section, **size)
    elif section == "drain":
        section_drain(t, store, table, rounds, peer_db=bool(args.mysql), **size)
    elif section == "relay":
        section_relay(t, store, table, rounds, **size)
    elif section == "drain-noop":
        section_drain_noop(t, store, table, rounds, **size)
    elif section == "relay-noop":
        section_relay_noop(t, store, table, rounds, **size)
    elif section == "forward":
        section_forward(t, store, table, rounds, broker, **size)
    elif section == "consume":
        section_consume(t, store, table, rounds, broker, **size)
    elif section == "jobs-publish":
        section_jobs_publish(t, store, table, rounds, jobs_broker, **size)
    else:
        section_jobs_work(t, store, table, rounds, jobs_broker, **size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, help="the cronbox tree to measure (put first on sys.path)")
    parser.add_argument("--label", required=True, help="its name in the table (before, main, after)")
    parser.add_argument("--before", help="a commit to measure as well, labelled before, alternated with --tree "
                                         "round by round (e.g. the merge base)")
    parser.add_argument("--mysql", default=os.environ.get("TEST_MYSQL_URL"))
    parser.add_argument("--postgres", "--postgresql", default=os.environ.get("TEST_POSTGRES_URL"),
                        help="a PostgreSQL server's URL, as bench_latency's (postgresql://postgres@127.0.0.1:5432/postgres)")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--section", action="append", choices=SECTIONS)
    parser.add_argument("--store", action="append", choices=["SQLite", "MariaDB", "PostgreSQL"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, help="each section's N (default its own: 2,000 rows, 5,000 jobs, "
                                                  "2,000 or 10,000 events); a small one for a smoke run")
    parser.add_argument("--out", help="append the rows (JSON) to this file")
    args = parser.parse_args()
    sections = args.section or SECTIONS
    servers = {"SQLite": None, "MariaDB": args.mysql, "PostgreSQL": args.postgres}
    stores = [s for s in (args.store or list(servers)) if s == "SQLite" or servers[s]]
    size = {"n": args.items} if args.items else {}
    trees = {args.label: args.tree}
    if args.before:
        trees = {"before": unpack(args.before), **trees}
    tables = {label: Report(label) for label in trees}
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, trees {trees}, load {os.getloadavg()[0]:.1f}",
          flush=True)
    exchange = f"cronbox-floor-{secrets.token_hex(4)}"
    broker = {"FLOOR_AMQP_URL": args.amqp, "FLOOR_EXCHANGE": exchange, "FLOOR_QUEUE": exchange + ".q"}
    # Issue 28's sections: the forwarded job queue's broker queue, the run's own (declared as the publisher does).
    jobs_broker = {"FLOOR_AMQP_URL": args.amqp, "FLOOR_JOBS_QUEUE": exchange + ".jobs"}
    uses_broker = {"forward", "consume"} & set(sections)
    uses_jobs = {"jobs-publish", "jobs-work"} & set(sections)
    if uses_broker:
        floor_amqp.declare(args.amqp, exchange, broker["FLOOR_QUEUE"])
    if uses_jobs:
        floor_amqp.declare_queue(args.amqp, jobs_broker["FLOOR_JOBS_QUEUE"])
    try:
        for store in stores:
            for section in sections:
                extra = {}
                if section == "forward":
                    extra = {**broker, "CRONBOX_AMQP_URL": args.amqp}
                elif section == "consume":
                    extra = {**broker, "FLOOR_EXCHANGE": "", "FLOOR_CONSUME": "1", "CRONBOX_AMQP_URL": args.amqp}
                elif section in uses_jobs:
                    extra = {**jobs_broker, "CRONBOX_AMQP_URL": args.amqp}
                t = Target(args.tree, servers[store], extra)
                try:
                    if len(trees) == 1:
                        run_section(section, t, store, tables[args.label], args.rounds, args, size, broker,
                                    jobs_broker)
                        continue
                    for r in range(args.rounds):  # the trees alternate, their order swapped every round
                        for label in (list(trees) if r % 2 == 0 else list(reversed(trees))):
                            t.use(trees[label])
                            run_section(section, t, store, tables[label], range(r, r + 1), args, size, broker,
                                        jobs_broker)
                finally:
                    t.close()
    finally:
        if uses_broker:
            floor_amqp.delete(args.amqp, exchange, broker["FLOOR_QUEUE"])
        if uses_jobs:
            floor_amqp.delete_queue(args.amqp, jobs_broker["FLOOR_JOBS_QUEUE"])
        if args.before:
            shutil.rmtree(trees["before"], ignore_errors=True)
    print(f"load {os.getloadavg()[0]:.1f}\n")
    for label, table in tables.items():
        print(table.markdown() + "\n")
        if args.out:
            with open(args.out, "a") as out:
                out.write(json.dumps({"label": label, "tree": trees[label], "rows": table.rows}) + "\n")


if __name__ == "__main__":
    main()
