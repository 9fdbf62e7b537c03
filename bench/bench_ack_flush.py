"""Acks of handlers that do not use ctx.session, before and after CRONBOX_ACK_FLUSH (issue 35, item 2).

    .venv/bin/python -m bench.bench_ack_flush --before REV [--mysql URL] [--postgres URL] [--runs 5]

REV is the commit before the window (e.g. the merge base with main): `git archive REV` is unpacked
into a temporary folder (with bench/quiet_handlers.py copied in), and every measure runs from
there ("before") and from this checkout ("after"), one `queue work --stop-when-empty` each, in
the same fresh database, the two taking turns:
- drain 10,000 no-op jobs: jobs/s (jobs / (last finished_at - first reserved_at), start-up not
  counted) and the ack statements it took (distinct finished_at: one per UPDATE);
- drain 200 jobs of 50 ms: the same;
- the issue's crash: 100 jobs of 50 ms appending a line to a file, the worker SIGKILLed once the file
  shows 65 lines (mid-window: the window holds 10 of them), then (the leases ended) a second
  worker: lines in all, and repeats.
Leases: the 50 ms jobs' timeout (1 s) + CRONBOX_LEASE_MARGIN 5 s, which outlasts the batch, as the
default margin (30 s) does, so the second worker need not wait 30 s. Rewrites the "Acks of quiet
handlers" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, select, text

from bench import quiet_handlers
from bench.bench_outbox import APP_ROOT, Target, child_env
from bench.report import write_section
from cronbox.outbox.core import clock
from cronbox.outbox.queue.models import Job

NOOP_JOBS, SLOW_JOBS, CRASH_JOBS, KILL_AT = 10_000, 200, 100, 65
LEASE_MARGIN = "5"


def unpack(rev: str, into: Path) -> Path:
    """The code at `rev`, as files (no worktree, no change to the repository), with the bench's handlers."""
    archive = subprocess.run(["git", "-C", str(APP_ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    shutil.copy(Path(quiet_handlers.__file__), into / "bench" / "quiet_handlers.py")
    return into


def env_for(t: Target, code: Path, **extra: str) -> dict:
    return {**child_env(t), "PYTHONPATH": str(code), "CRONBOX_HANDLERS": "bench.quiet_handlers",
            "CRONBOX_LEASE_MARGIN": LEASE_MARGIN, **extra}


def fresh(t: Target, handler, n: int) -> None:
    with t.runtime.engine.begin() as c:
        c.execute(text("DELETE FROM cronbox_jobs"))
    for start in range(0, n, 1000):
        with t.runtime.sessions.begin() as s:
            for i in range(start, min(n, start + 1000)):
                handler.dispatch(s, {"i": i})


def work(env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cronbox", "queue", "work", "--queue", quiet_handlers.QUEUE,
                             "--stop-when-empty"], env=env, cwd="/", stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def drain(t: Target, code: Path, handler, n: int) -> dict:
    fresh(t, handler, n)
    proc = work(env_for(t, code))
    _, err = proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    with t.runtime.sessions() as s:
        done = s.scalar(select(func.count()).select_from(Job).where(Job.status == "done"))
        first, last = s.execute(select(func.min(Job.reserved_at), func.max(Job.finished_at))).one()
        acks = s.scalar(select(func.count(func.distinct(Job.finished_at))))
    assert done == n, f"{done} of {n} done"
    return {"rate": n / (last - first).total_seconds(), "acks": acks}


def lines(path: Path) -> list[str]:
    text_ = path.read_text() if path.exists() else ""
    return text_[:text_.rfind("\n") + 1].split()


def crash(t: Target, code: Path, folder: Path) -> dict:
    """The issue's measure: what one SIGKILL mid-batch makes the next worker call again."""
    effects = folder / "effects.txt"
    effects.unlink(missing_ok=True)
    fresh(t, quiet_handlers.call, CRASH_JOBS)
    env = env_for(t, code, BENCH_EFFECTS_FILE=str(effects))
    proc = work(env)
    deadline = time.monotonic() + 120
    while len(lines(effects)) < KILL_AT:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    before = len(lines(effects))
    with t.runtime.sessions() as s:
        acked = s.scalar(select(func.count()).select_from(Job).where(Job.status == "done"))
        lease = s.scalar(select(func.max(Job.available_at)).where(Job.status == "reserved"))
    while lease is not None and clock.utcnow() <= lease:
        time.sleep(0.1)
    again = work(env)
    _, err = again.communicate()
    assert again.returncode == 0, err[-2000:]
    total = lines(effects)
    assert set(total) == {str(i) for i in range(CRASH_JOBS)}
    return {"before_kill": before, "acked": acked, "total": len(total), "repeats": len(total) - CRASH_JOBS}


def measure(t: Target, trees: dict[str, Path], runs: int, folder: Path) -> dict[str, dict[str, list]]:
    """Each measure `runs` times per tree, the trees taking turns, first one then the other: a load
    that comes and goes on a shared machine, and whatever the database keeps of the run before, fall
    on both alike."""
    results = {name: {"noop": [], "slow": [], "crash": []} for name in trees}
    for run in range(runs):
        for name in (list(trees) if run % 2 == 0 else list(reversed(trees))):
            code = trees[name]
            results[name]["noop"].append(drain(t, code, quiet_handlers.noop, NOOP_JOBS))
            results[name]["slow"].append(drain(t, code, quiet_handlers.call, SLOW_JOBS))
            results[name]["crash"].append(crash(t, code, folder))
    return results


def rate_cell(results: list[dict]) -> str:
    rates = [r["rate"] for r in results]
    return f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", required=True, help="the commit to measure as before (e.g. the merge base)")
    parser.add_argument("--mysql", default=os.environ.get("TEST_MYSQL_URL"))
    parser.add_argument("--postgres", default=None)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    before_rev = subprocess.run(["git", "-C", str(APP_ROOT), "rev-parse", "--short", args.before], capture_output=True,
                                text=True, check=True).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix="cronbox-ackflush-"))
    trees = {"before": unpack(args.before, Path(tempfile.mkdtemp(dir=folder))), "after": APP_ROOT}
    stores = [("SQLite", None)] + ([("MariaDB", args.mysql)] if args.mysql else []) + (
        [("PostgreSQL", args.postgres)] if args.postgres else [])
    rows = []
    try:
        for label, url in stores:
            t = Target(label, url)
            try:
                for name, r in measure(t, trees, args.runs, folder).items():
                    crashes = r["crash"]
                    row = (label, name, rate_cell(r["noop"]), f"{statistics.median(x['acks'] for x in r['noop']):.0f}",
                           rate_cell(r["slow"]), f"{statistics.median(x['acks'] for x in r['slow']):.0f}",
                           ", ".join(f"{c['before_kill']}/{c['acked']}/{c['repeats']}" for c in crashes))
                    rows.append(row)
                    print(" | ".join(row), flush=True)
            finally:
                t.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    table = (f"| store | code | drain {NOOP_JOBS:,} no-op jobs (jobs/s, median (min-max of {args.runs})) | its acks | "
             f"drain {SLOW_JOBS} jobs of 50 ms (jobs/s) | its acks | crash: calls before the kill / acked / "
             f"repeated (of {CRASH_JOBS}) |\n|---|---|---|---|---|---|---|\n")
    table += "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"
    print(table)
    command = f"python -m bench.bench_ack_flush --before {before_rev}" + (" --mysql ..." if args.mysql else "") + (
        " --postgres ..." if args.postgres else "")
    write_section("ack-flush", "Acks of quiet handlers: CRONBOX_ACK_FLUSH", command, table + NOTES)


NOTES = """
"before" is the code at the commit named (acks written at a batch's end, or when a lease would run
out); "after" is this checkout with the default CRONBOX_ACK_FLUSH (500ms of handler time). One
`queue work --stop-when-empty` per drain, in one fresh database per store; acks counted as distinct
`finished_at` values (one per ack UPDATE). No-op jobs never fill the window: one ack per claimed batch
of 100, as before; the rates differ within this shared machine's noise (load average 8-9 on 2 cores
during these runs; the two codes take turns, first one then the other). Jobs of 50 ms fill it every
10 jobs: about 20 more small UPDATEs for 200 jobs (before: 4-6, at a batch's end or where this bench's
6 s lease would run out), which costs nothing visible next to 50 ms of handler time. The crash is the
issue's: a worker SIGKILLed once 65 of 100 jobs wrote their line; before, all 65 ran again (the whole
batch was still reserved); after, the 5 finished since the last ack (at 60), as the window allows.
"""

if __name__ == "__main__":
    main()
