"""What a concurrency group and a cost budget cost per job, against the same no-op drain.

    .venv/bin/python -m bench.bench_groups [--mysql mysql+pymysql://root:@127.0.0.1/test] [--n 2000] [--rounds 3]

One worker in this process drains n no-op jobs, in alternating rounds on one database: plain (the
peer: acks batched, no pre-call check), in a concurrency group (its limit never reached: the slot
taken in the gate's transaction, freed with an ack of its own), and on a queue with a cost budget
(one guarded UPDATE of the budget's window in the gate's transaction). Reported: jobs/s, and each
one's time per job as a ratio to the plain drain's measured in the same run. Rewrites the
"Concurrency groups and budgets" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import statistics
import time

from sqlalchemy import event, text

from bench.bench_outbox import Target
from bench.report import write_section
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.worker import Worker

KINDS = ("plain", "group", "budget")


def handlers(registry: Registry) -> dict:
    def noop():  # one function per job: the decorator sets its .dispatch
        return lambda payload, ctx: None

    return {
        "plain": job("bplain", name="bench.groups.plain", registry=registry)(noop()),
        "group": job("bgroup", name="bench.groups.group", concurrency_group="bench", concurrency_limit=1000,
                     registry=registry)(noop()),
        "budget": job("bbudget", name="bench.groups.budget", registry=registry)(noop()),
    }


def round_trips(rt: Runtime, handler, queue: str, n: int = 100) -> tuple[float, float]:
    """(statements, commits) per job of a drain of n jobs, counted on the engine."""
    counts = {"statements": 0, "commits": 0}

    def statement(*_):
        counts["statements"] += 1

    def commit(*_):
        counts["commits"] += 1

    event.listen(rt.engine, "before_cursor_execute", statement)
    event.listen(rt.engine, "commit", commit)
    try:
        drain(rt, handler, queue, n, count_from=lambda: counts.update(statements=0, commits=0))
    finally:
        event.remove(rt.engine, "before_cursor_execute", statement)
        event.remove(rt.engine, "commit", commit)
    return counts["statements"] / n, counts["commits"] / n


def drain(rt: Runtime, handler, queue: str, n: int, count_from=None) -> float:
    with rt.engine.begin() as c:
        c.execute(text("DELETE FROM cronbox_jobs"))
    for start in range(0, n, 1000):
        with rt.sessions.begin() as s:
            for i in range(start, min(n, start + 1000)):
                handler.dispatch(s, {"i": i})
    worker = Worker(rt, [queue])
    if count_from is not None:
        count_from()  # the dispatches above are not the drain's
    started = time.perf_counter()
    worker.run(Budget(max_time=None, memory_mb=None))
    seconds = time.perf_counter() - started
    assert worker.stats.done == n and worker.stats.deferred == 0, worker.stats
    return seconds


def run(label: str, mysql_url: str | None, n: int, rounds: int) -> dict:
    t = Target(label, mysql_url)
    try:
        registry = Registry()
        jobs = handlers(registry)
        settings = load_settings(environ={**t.env, "CRONBOX_HANDLERS": "",
                                          "CRONBOX_QUEUE_BUDGETS": "bbudget=1000000000/h"})
        rt = Runtime(settings, registry=registry)
        times = {kind: [] for kind in KINDS}
        drain(rt, jobs["plain"], "bplain", min(n, 200))  # warm-up
        for _ in range(rounds):
            for kind in KINDS:
                times[kind].append(drain(rt, jobs[kind], f"b{kind}", n))
        result = {kind: statistics.median(values) for kind, values in times.items()}
        result["trips"] = {kind: round_trips(rt, jobs[kind], f"b{kind}") for kind in KINDS}
        rt.dispose()
        return result
    finally:
        t.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql", default=None)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    targets = [("SQLite", None)] + ([("MariaDB", args.mysql)] if args.mysql else [])
    rows = []
    for label, url in targets:
        result = run(label, url, args.n, args.rounds)
        base = result["plain"]
        for kind in KINDS:
            per_job_ms = result[kind] / args.n * 1000
            statements, commits = result["trips"][kind]
            rows.append(f"| {label} | {kind} | {args.n / result[kind]:,.0f} | {per_job_ms:.3f} | "
                        f"{result[kind] / base:.2f}× | {statements:.2f} | {commits:.2f} |")
            print(rows[-1], flush=True)
    body = (f"One in-process worker draining {args.n} no-op jobs, median of {args.rounds} alternating rounds. "
            "`plain` is the peer: no pre-call check, acks batched. `group`: a concurrency group whose limit is "
            "never reached (the slot taken in the gate's transaction and passed on to the next job of the group; "
            "the last one's freed with its ack). `budget`: a "
            "queue cost budget (one guarded UPDATE in the gate's transaction). The ratio is time per job "
            "against `plain` in the same run; statements and commits per job are counted on the engine over a "
            "drain of 100 jobs. A gated job commits one transaction before its handler starts "
            "(its slot or its spend must be visible to every other worker first), so its cost is about one "
            "durable commit of this database, against a share of one batched ack for `plain`; consecutive "
            "jobs of a group pass the slot on in that commit instead of freeing it in one of their own.\n\n"
            "| database | jobs | jobs/s | ms/job | time/job vs plain | statements/job | commits/job |\n"
            "|---|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows))
    command = "python -m bench.bench_groups" + (f" --mysql {args.mysql}" if args.mysql else "") + f" --n {args.n}"
    write_section("groups", "Concurrency groups and budgets", command, body)


if __name__ == "__main__":
    main()
