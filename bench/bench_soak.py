"""Soak: many simulated days of ticks with the scheduler's pruning on, in one process.

    nice -n 10 .venv/bin/python -m bench.bench_soak [--events 1000000] [--jobs 1000000] [--days 35]
        [--ticks-per-day 48] [--mysql mysql+pymysql://root:@127.0.0.1/test] [--no-write]

Time is frozen (outbox.core.clock) and advanced by 24 h / --ticks-per-day before each tick; before each
tick the share of events and jobs for that slice of the day is recorded and dispatched (in
transactions of 500). Each tick is `run_tick(..., linger=False)`: the code path `python -m cronbox
tick` takes, lock, scheduler (the daily `cronbox.prune`, hourly sweep, 5-minute health check), relay
and worker. Retention windows are 2-30 days, so after 30 simulated days every cronbox_* table should
stop growing; this prints per day: RSS, rows per table, warnings/errors logged, and checks that
everything recorded was handled. Writes a "Soak: <backend>" section of docs/benchmarks.md per
backend; --no-write leaves the file alone (short runs that only prove the harness works).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import datetime

from sqlalchemy import func, inspect, select, text

import cronbox
from bench import handlers
from bench.bench_outbox import Target
from bench.report import write_section
from cronbox.cron.cli import main as cronbox_main  # what a tick runs one-off requests with
from cronbox.cron.scheduling.tick import run_tick
from cronbox.outbox.core import clock
from cronbox.outbox.core.logs import configure_logging
from cronbox.outbox.events.models import Delivery
from cronbox.outbox.queue.models import Job
from cronbox.outbox.core.resources import rss_kb

START = datetime(2026, 1, 1, 0, 5)  # five past midnight UTC: the first tick is in day 1's prune slot
BATCH = 500
TABLES_SHOWN = ("cronbox_events", "cronbox_deliveries", "cronbox_jobs", "cronbox_heartbeats",
                "cronbox_schedule_runs")


class Problems(logging.Handler):
    """Counts the warnings and errors cronbox logs (they also go to its daily log file)."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(f"{record.levelname} {record.getMessage()[:160]}")


def split(total: int, parts: int) -> list[int]:
    """`total` as `parts` near-equal integers (sum exact)."""
    return [total * (i + 1) // parts - total * i // parts for i in range(parts)]


def add_work(t: Target, events: int, jobs: int, serial: int) -> None:
    todo = [("e", n) for n in range(events)] + [("j", n) for n in range(jobs)]
    for start in range(0, len(todo), BATCH):
        with t.runtime.sessions.begin() as s:
            for kind, n in todo[start:start + BATCH]:
                if kind == "e":
                    cronbox.record(s, "bench.noop", {"i": serial + n})
                else:
                    handlers.job_noop.dispatch(s, {"i": serial + n})


def table_rows(t: Target) -> dict[str, int]:
    names = sorted(n for n in inspect(t.runtime.engine).get_table_names() if n.startswith("cronbox_"))
    with t.runtime.engine.connect() as c:
        return {n: c.execute(text(f"SELECT COUNT(*) FROM {n}")).scalar() for n in names}


def unfinished(t: Target) -> tuple[int, int]:
    with t.runtime.sessions() as s:
        return (s.scalar(select(func.count()).select_from(Delivery).where(Delivery.status != "done")),
                s.scalar(select(func.count()).select_from(Job).where(Job.status != "done")))


def soak(t: Target, *, events: int, jobs: int, days: int, ticks_per_day: int) -> dict:
    problems = Problems()
    configure_logging(t.settings.private_dir("logs")).addHandler(problems)
    slot = 86400 / ticks_per_day
    per_tick_events = split(events, days * ticks_per_day)
    per_tick_jobs = split(jobs, days * ticks_per_day)
    days_out, serial, exits = [], 0, set()
    started = time.perf_counter()
    with clock.frozen(START):
        for day in range(days):
            day_started, day_problems = time.perf_counter(), problems.count
            for tick in range(ticks_per_day):
                n = day * ticks_per_day + tick
                add_work(t, per_tick_events[n], per_tick_jobs[n], serial)
                serial += per_tick_events[n] + per_tick_jobs[n]
                report = run_tick(t.runtime, run_command=cronbox_main, max_time=50, linger=False, memory_mb=None)
                exits.add(report.exit_code)
                clock.advance(slot)
            rows = table_rows(t)
            days_out.append({"day": day + 1, "rss_mb": rss_kb() / 1024, "rows": rows,
                             "problems": problems.count - day_problems, "seconds": time.perf_counter() - day_started})
            shown = "  ".join(f"{name.removeprefix('cronbox_')} {rows.get(name, 0):>7}" for name in TABLES_SHOWN)
            print(f"day {day + 1:>3}: rss {rss_kb() / 1024:6.1f} MiB  {shown}  warnings {days_out[-1]['problems']}"
                  f"  ({days_out[-1]['seconds']:.0f}s)", flush=True)
    left = unfinished(t)
    return {"days": days_out, "problems": problems.count, "first_problems": problems.first, "exits": exits,
            "unfinished": left, "seconds": time.perf_counter() - started}


def markdown(label: str, args, r: dict) -> str:
    days = r["days"]
    names = [n for n in TABLES_SHOWN if any(n in d["rows"] for d in days)]
    picks = sorted({1, 2, 3, 7, 8, 14, 21, 28, 30, 31, len(days)} & set(range(1, len(days) + 1)))
    head = "| day | RSS MiB | " + " | ".join(n.removeprefix("cronbox_") for n in names) + " | warnings |"
    lines = [head, "|" + "---|" * (len(names) + 3)]
    for d in (days[p - 1] for p in picks):
        lines.append(f"| {d['day']} | {d['rss_mb']:.1f} | " + " | ".join(f"{d['rows'].get(n, 0):,}" for n in names)
                     + f" | {d['problems']} |")
    others = sorted({n for d in days for n in d["rows"]} - set(names))
    biggest_other = max((d["rows"][n] for d in days for n in others), default=0)
    week = min(7, len(days))
    return (f"{label}: {args.events:,} events (consumer `bench.noop`) and {args.jobs:,} jobs (`bench.job.noop`) "
            f"over {args.days} simulated days, {args.ticks_per_day} ticks a day, in {r['seconds'] / 60:.0f} min. "
            f"RSS {days[week - 1]['rss_mb']:.1f} MiB on day {week}, {days[-1]['rss_mb']:.1f} MiB on day "
            f"{len(days)} (highest at a day's end {max(d['rss_mb'] for d in days):.1f} MiB: the whole bench process, "
            f"every tick in one interpreter; flat is what counts); warnings or errors logged: {r['problems']}; "
            f"tick exit codes {sorted(r['exits'])}; not done at the end: {r['unfinished'][0]} deliveries, "
            f"{r['unfinished'][1]} jobs.\n\nRows at the end of a day (its prune runs at 00:00; events and "
            f"deliveries are kept 7 days, done jobs 48 h, heartbeats 7 days, schedule runs 30 days):\n\n"
            + "\n".join(lines) + f"\n\nThe other cronbox_* tables held at most {biggest_other:,} rows.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=35)
    parser.add_argument("--ticks-per-day", type=int, default=48)
    parser.add_argument("--mysql", default=None, help="also soak a fresh MariaDB database on this server")
    parser.add_argument("--no-sqlite", action="store_true", help="only MariaDB (with --mysql)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    failed = False
    targets = ([] if args.no_sqlite else [("SQLite", None)]) + ([("MariaDB", args.mysql)] if args.mysql else [])
    for label, url in targets:
        print(f"--- {label}", flush=True)
        t = Target(label, url)
        try:
            r = soak(t, events=args.events, jobs=args.jobs, days=args.days, ticks_per_day=args.ticks_per_day)
        finally:
            t.close()
        for line in r["first_problems"]:
            print(f"  logged: {line}")
        failed |= bool(r["problems"] or r["unfinished"] != (0, 0) or r["exits"] != {0})
        if not args.no_write:  # one section per backend: a MariaDB run does not erase the SQLite figures
            command = (f"nice -n 10 python -m bench.bench_soak --events {args.events} --jobs {args.jobs} "
                       f"--days {args.days} --ticks-per-day {args.ticks_per_day}" + (" --no-sqlite --mysql URL" if url else ""))
            write_section(f"soak-{label.lower()}", f"Soak: {label}", command, markdown(label, args, r))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
