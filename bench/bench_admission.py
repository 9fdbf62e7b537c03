"""Admission benchmark: what checking and recording handler profiles costs a no-op job drain.

    .venv/bin/python -m bench.bench_admission [--mysql mysql+pymysql://root:@127.0.0.1/test] [--size 5000] [--runs 7]

Two measures, both in the same run:
- the drain: one `queue work --stop-when-empty --max-time 600 --memory 1024` draining `--size` no-op jobs,
  with admission on (a profile of the handler exists, so every job is checked against time and memory,
  probed and recorded) and with CRONBOX_ADMISSION=off, interleaved; the rate is jobs / (last
  finished_at - first reserved_at) as bench_queue measures it. The ratio on/off is noisy at the
  few-% level on a shared two-core machine, so
- the calls: the admission's own work per job timed in this process over many jobs, as a share of
  the no-op job's time off (1 / the drain rate with admission off). The runner's calls between
  two jobs (the budget's stop_reason, admission's check, probe and record, the budget's record) are
  made with admission on and with it off, in CPU time (a shared machine's waits left out), on minus
  off: what admission adds, the budget's own RSS reading (shared with admission's check) not
  counted. This is the number the issue's "under 5 % of the no-op drain" is about; the profile
  writes (one transaction per run or per FLUSH_SECONDS) are in the drain's figure, not in this one.
  Its share is given twice: of the no-op job's time (1 / the rate off: inflated by a loaded
  machine, which makes the share look smaller) and of the no-op job's CPU time (the worker's CPU
  for a drain off, minus a worker's that finds nothing to do, per job: CPU against CPU; on MariaDB
  the server's CPU is left out, so the share reads high there).
Rewrites the "Admission" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from sqlalchemy import func, select, text

from bench import handlers
from bench.bench_outbox import Target, child_env
from bench.bench_queue import bulk_dispatch
from bench.report import write_section
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.admission import Admission
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.queue.models import Job

CALLS = 100_000  # per loop; 5 loops on and 5 off


def work(t: Target, admission: str) -> float:
    """One worker draining the bench queue; returns the CPU seconds it used (user + system)."""
    t.runtime.engine.dispose()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Started through /bin/sh, as cron starts it (cron -> sh -> artisan_via_cron.sh -> python): a
    # worker forked straight from this large process inherits its peak RSS in ru_maxrss, and its
    # profiles then read the peak from /proc/self/status (outbox.core.resources.PeakProbe), ~15 us
    # more per job than a worker cron starts pays.
    proc = subprocess.run(["/bin/sh", "-c", '"$0" "$@"; exit $?', sys.executable, "-m", "cronbox", "queue", "work",
                           "--queue", "bench", "--stop-when-empty", "--max-time", "600", "--memory", "1024"],
                          env={**child_env(t), "CRONBOX_ADMISSION": admission}, cwd="/", capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def drain(t: Target, n: int, admission: str) -> tuple[float, float]:
    """(jobs/s, the worker's CPU seconds) draining `n` no-op jobs."""
    with t.runtime.engine.begin() as c:
        c.execute(text("DELETE FROM cronbox_jobs"))
    bulk_dispatch(t, handlers.job_noop, n)
    cpu = work(t, admission)
    with t.runtime.sessions() as s:
        done = s.scalar(select(func.count()).select_from(Job).where(Job.status == "done"))
        first, last = s.execute(select(func.min(Job.reserved_at), func.max(Job.finished_at))).one()
    assert done == n, f"{done} of {n} done"
    return n / (last - first).total_seconds(), cpu


def idle_cpu(t: Target) -> float:
    """The CPU seconds of a worker that finds nothing to do (start, imports, exit): left out of a drain's."""
    with t.runtime.engine.begin() as c:
        c.execute(text("DELETE FROM cronbox_jobs"))
    return work(t, "off")


def calls_cost(t: Target, size: int, repeats: int = 5) -> tuple[float, int]:
    """CPU seconds per job that admission adds to the runner's calls around a no-op job, with
    --max-time and --memory set and the handler's profile as the drains left it; and its growth (KiB).
    Its samples are dropped every `size` jobs, as a drain of `size` jobs writes them once."""
    name = "bench.job.noop"

    def loop(mode: str) -> float:
        admission = Admission("job", load_settings(environ={**t.env, "CRONBOX_ADMISSION": mode}))
        admission.start(t.runtime.sessions)  # the profile the drains wrote
        budget = Budget(max_time=600, memory_mb=1024)
        started = time.process_time()
        for done in range(1, CALLS + 1):
            budget.stop_reason()
            admission.check(name, budget)
            probe = admission.probe()
            budget.record(0.0001, admission.record(name, probe, 0.0001))
            if done % size == 0:
                admission.book.pending.clear()
        return (time.process_time() - started) / CALLS

    on, off = [], []
    for _ in range(repeats):  # interleaved; the least of each: the machine's noise only ever adds
        on.append(loop("on"))
        off.append(loop("off"))
    profile = Admission("job", t.settings)
    profile.start(t.runtime.sessions)
    known = profile.book.get(name)
    return min(on) - min(off), known.growth_kb if known is not None else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql", default=os.environ.get("TEST_MYSQL_URL"))
    parser.add_argument("--size", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    loads = [os.getloadavg()[0]]
    rows = []
    for label, url in [("SQLite", None)] + ([("MariaDB", args.mysql)] if args.mysql else []):
        t = Target(label, url)
        try:
            drain(t, 200, "on")  # the handler's profile, as a worker finds it after its first run
            rates = {"on": [], "off": []}
            cpus, idle = [], []
            for _ in range(args.runs):  # interleaved: the machine's load drifts alike for both
                for mode in ("off", "on"):
                    rate, cpu = drain(t, args.size, mode)
                    rates[mode].append(rate)
                    if mode == "off":
                        cpus.append(cpu)
                    loads.append(os.getloadavg()[0])
                idle.append(idle_cpu(t))
            on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
            paired = statistics.median(a / b for a, b in zip(rates["on"], rates["off"]))  # each pair ran back to back
            job_cpu = (statistics.median(cpus) - statistics.median(idle)) / args.size  # the worker's, per job, off
            per_job, growth = calls_cost(t, args.size)
            share = per_job * off  # of one no-op job's time with admission off
            cpu_share = per_job / job_cpu  # of its CPU time: CPU against CPU, whatever the machine's load
            rows.append((label, f"{off:,.0f} ({min(rates['off']):,.0f}-{max(rates['off']):,.0f})",
                         f"{on:,.0f} ({min(rates['on']):,.0f}-{max(rates['on']):,.0f})", f"{paired:.3f}",
                         f"{per_job * 1e6:.1f}", f"{share * 100:.1f} % ({1e6 / off:.0f} µs)",
                         f"{cpu_share * 100:.1f} % ({job_cpu * 1e6:.0f} µs)"))
            print(label, f"off {off:,.0f}/s", f"on {on:,.0f}/s", f"on/off {paired:.3f}",
                  f"calls {per_job * 1e6:.2f} us/job = {share * 100:.1f} % of a no-op job ({1e6 / off:.0f} us),",
                  f"{cpu_share * 100:.1f} % of its CPU ({job_cpu * 1e6:.0f} us)",
                  f"(profile's growth {growth} KiB)", flush=True)
        finally:
            t.close()
    table = (f"| store | no-op drain, admission off (jobs/s, median (min-max of {args.runs})) | admission on | "
             "on/off (median of the back-to-back pairs' ratios) | admission's calls per job (µs of CPU) | "
             "share of a no-op job's time (off: 1 / its rate) | share of a no-op job's CPU time (off) |\n"
             "|---|---|---|---|---|---|---|\n")
    table += "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"
    table += f"\nLoad average (1 min) during the runs: {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores.\n"
    print(table)
    command = "python -m bench.bench_admission" + (" --mysql mysql+pymysql://root:@127.0.0.1/test" if args.mysql else "")
    write_section("admission", "Admission by handler profile", command, table + NOTES)


NOTES = """
Per job, admission adds: a check (a dict lookup and a few comparisons; against `--memory` it takes
the RSS the budget's own memory check read before the item, `/proc/self/statm` kept open and read
with `pread`, instead of a reading of its own; the kernel's cgroup/LVE limit is read at most once a
second, not per job); before the call a reset of the kernel's peak mark (a write to
`/proc/self/clear_refs`, kept open) and one `getrusage`, whose `ru_maxrss` right after the reset is
the RSS the call starts from; after the call one `getrusage` for its peak; and the sample, kept in
memory (only the last window of them per handler: the write keeps no more). A fork resets the
probes through `os.register_at_fork`, not a `getpid` per reading. The profile rows are written once
per run (or every 5 s of a long one) in one transaction for all the handlers that ran: never a
round trip per job. The target is under 5 % of the no-op job. The calls are timed in CPU time, on
minus off; the share of the job's time divides by a wall-clock job time that a loaded machine
stretches (see the load average), so the share of its CPU time is the steadier of the two; the
drain's on/off ratio carries the run-to-run noise of a shared two-core machine, so its min-max
ranges are printed beside it.

The workers are started through `/bin/sh`, as cron starts them. A worker forked straight from a large
process (this bench, a test runner) inherits that process's peak in `ru_maxrss`, so its profiles read
the peak from `/proc/self/status` instead (`VmHWM`), about 15 µs more per job: started that way, the
MariaDB drain measured 0.88 on/off on a quiet machine (load 0.1-0.9) against 0.96 on SQLite.
"""

if __name__ == "__main__":
    main()
