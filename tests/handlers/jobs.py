"""Jobs for the subprocess tests (CRONBOX_HANDLERS=tests.handlers.jobs).

TEST_RUNS_DIR  jobs.record appends "job attempt pid start end" to runs-<pid>.txt
TEST_SLEEP     seconds jobs.record / jobs.write sleep
TEST_INSIDE_FILE / TEST_RELEASE_FILE  jobs.block writes the first, waits for the second
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import insert

import cronbox
from cronbox.outbox.core.faults import crash_point
from tests.handlers.effects import effects


def _pause():
    seconds = float(os.environ.get("TEST_SLEEP") or 0)
    if seconds:
        time.sleep(seconds)


@cronbox.job("default", name="jobs.record", tries=100, timeout=0.5)
def record_run(payload, ctx):
    started = time.time()
    _pause()
    crash_point("in-handler")
    with open(Path(os.environ["TEST_RUNS_DIR"]) / f"runs-{os.getpid()}.txt", "a") as out:
        out.write(f"{payload['n']} {ctx.attempt} {os.getpid()} {started:.6f} {time.time():.6f}\n")


@cronbox.job("default", name="jobs.write", tries=100, timeout=0.5)
def write(payload, ctx):
    _pause()
    crash_point("in-handler")
    ctx.session.execute(insert(effects).values(consumer="jobs.write", event_id=payload["n"]))


@cronbox.job("default", name="jobs.poison", tries=3, timeout=0.5)
def poison(payload, ctx):
    os._exit(9)


@cronbox.job("default", name="jobs.block", timeout=60)
def block(payload, ctx):
    Path(os.environ["TEST_INSIDE_FILE"]).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not Path(os.environ["TEST_RELEASE_FILE"]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@cronbox.job("default", name="jobs.slow", timeout=10)
def slow(payload, ctx):
    """Longer than the server's wait_timeout in the short-wait_timeout test, without touching the database."""
    _pause()
    with open(Path(os.environ["TEST_RUNS_DIR"]) / f"runs-{os.getpid()}.txt", "a") as out:
        out.write(f"{payload['n']} {ctx.attempt} {os.getpid()} 0 0\n")
