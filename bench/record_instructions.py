"""Instructions per transaction of bench_record's cases, counted by callgrind: a number load does not move.

    .venv/bin/python -m bench.record_instructions [--mysql mysql+pymysql://root:@127.0.0.1/test] [--n 100]

Runs itself under `valgrind --tool=callgrind`. Inside, each case's n transactions run within an
itertools iterator of its own (a C function nothing on the measured path calls), so the inclusive
cost callgrind_annotate reports for that function is the case's instructions. On MariaDB that is
the client's side only; on SQLite the library's work is included. The cyclic garbage collector is
off while a case runs (its collections would land on whichever case is running, ~10 %). Prints a
table, writes nothing
(docs/benchmarks.md quotes its numbers in the "Record and dispatch" notes).
"""
from __future__ import annotations

import argparse
import gc
import itertools
import os
import re
import subprocess
import sys
import tempfile

# One iterator per case: its C __next__ is the marker whose inclusive cost is the case's.
MARKERS = {
    "takewhile": lambda run, n: list(itertools.takewhile(lambda i: run(i) or True, range(n))),
    "dropwhile": lambda run, n: list(itertools.dropwhile(lambda i: run(i) or True, range(n))),
    "filterfalse": lambda run, n: list(itertools.filterfalse(run, range(n))),
    "accumulate": lambda run, n: list(itertools.accumulate(range(n), lambda _, i: run(i))),
    "starmap": lambda run, n: list(itertools.starmap(run, ((i,) for i in range(n)))),
    "compress": lambda run, n: list(itertools.compress(range(n), (run(i) or 1 for i in range(n)))),
    "groupby": lambda run, n: list(itertools.groupby(range(n), key=run)),
    "pairwise": lambda run, n: list(itertools.pairwise(run(i) for i in range(n))),
    "islice": lambda run, n: list(itertools.islice((run(i) for i in range(n)), n)),
    "tee": lambda run, n: list(itertools.tee((run(i) for i in range(n)), 1)[0]),
    # SQLAlchemy's ORM flush iterates a zip_longest too: a few hundred instructions a flush, <1 %.
    "zip_longest": lambda run, n: list(itertools.zip_longest((run(i) for i in range(n)),)),
}


def child(mysql: str | None, n: int) -> None:
    from bench import bench_record as br
    t = br.Target("callgrind", mysql)
    try:
        cases = [(row, case, fn) for row, group in br.ROWS for case, fn in group]
        assert len(cases) <= len(MARKERS), "one marker per case"
        for (row, case, fn), marker in zip(cases, MARKERS):
            for i in range(20):  # warm up outside the markers
                fn(t, i)
            gc.collect()
            gc.disable()  # a cyclic collection would land on whichever case is running
            MARKERS[marker](lambda i, fn=fn: fn(t, i), n)
            gc.enable()
            print(f"{marker}\t{row}\t{case}", flush=True)
    finally:
        t.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql", default=None)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.mysql, args.n)
        return
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
                   "bench.record_instructions", "--child", "--n", str(args.n)] + (["--mysql", args.mysql] if args.mysql else [])
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode:
            sys.exit(f"the callgrind run failed:\n{run.stderr[-3000:]}")
        cases = [line.split("\t") for line in run.stdout.splitlines() if line.count("\t") == 2]
        annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                                   capture_output=True, text=True, check=True).stdout
    cost = {}
    for line in annotated.splitlines():
        found = re.match(r"\s*([\d,]+) .*itertoolsmodule\.c:(\w+?)_next \[", line)
        if found:
            cost[found.group(2)] = int(found.group(1).replace(",", ""))
    print("| business row | case | instructions per transaction |\n|---|---|---|")
    for marker, row, case in cases:
        print(f"| {row} | {case} | {cost.get(marker, 0) / args.n / 1e6:.2f} M |")


if __name__ == "__main__":
    main()
