"""A concurrency-group job for the subprocess tests (CRONBOX_HANDLERS=tests.handlers.group_jobs).

TEST_INSIDE_FILE  group.block writes its pid there once it holds its slot, then waits (until killed)
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import cronbox


@cronbox.job("gq", name="group.block", timeout=60, concurrency_group="gslots", concurrency_limit=1)
def block(payload, ctx):
    Path(os.environ["TEST_INSIDE_FILE"]).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _append(path: Path, line: str) -> None:
    with open(path, "a") as out:  # O_APPEND: one short line per write, whole
        out.write(line + "\n")


@cronbox.job("gpair", name="group.pair", timeout=30, concurrency_group="gpair", concurrency_limit=2)
def pair(payload, ctx):
    """Appends "start N" / "end N" to TEST_RUNS_FILE, and between them keeps its slot until a worker was
    refused one (a "group gpair is full" line in the day's log after this start), a third job runs
    beside it (the violation the test looks for), or all TEST_JOBS jobs have started."""
    runs, total = Path(os.environ["TEST_RUNS_FILE"]), int(os.environ["TEST_JOBS"])
    logs = Path(os.environ["CRONBOX_INSTANCE"]) / "logs"
    refusals = lambda: sum(line.count("concurrency group gpair is full")  # noqa: E731
                           for log in logs.glob("cronbox-*.log") for line in _lines(log))
    seen = refusals()
    _append(runs, f"start {payload['n']}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = _lines(runs)
        starts = sum(line.startswith("start") for line in lines)
        if refusals() > seen or starts - sum(line.startswith("end") for line in lines) > 2 or starts >= total:
            break
        time.sleep(0.01)
    _append(runs, f"end {payload['n']}")
