"""Handlers for the infrastructure-fault tests (CRONBOX_HANDLERS=tests.handlers.faults).

TEST_EFFECTS_FILE  the quiet consumer appends "<event id>" per call (an external effect)
TEST_GATE_DIR      the first process to make its TEST_GATE_AT-th call of `faults.db` (or of the job
                   `faults.write`) writes <dir>/consumer.inside (job.inside) and waits for
                   <dir>/consumer.release (job.release): the test cuts the database meanwhile,
                   so the cut lands in the middle of a claimed batch, after the handler's writes
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import insert

import cronbox
from tests.handlers.effects import effects

_calls = {"consumer": 0, "job": 0}


def _gate(kind: str) -> None:
    folder = os.environ.get("TEST_GATE_DIR")
    if not folder:
        return
    _calls[kind] += 1
    inside = Path(folder) / f"{kind}.inside"
    if _calls[kind] != int(os.environ.get("TEST_GATE_AT", "3")) or inside.exists():
        return
    inside.write_text(str(os.getpid()))
    release, deadline = Path(folder) / f"{kind}.release", time.monotonic() + 30
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@cronbox.consumer("faulty", name="faults.db", timeout=3, max_attempts=100)
def db_writer(event, ctx):
    ctx.session.execute(insert(effects).values(consumer="faults.db", event_id=event.id))
    _gate("consumer")  # its write is in ctx.session, not committed: the cut must roll it back


@cronbox.consumer("faulty", name="faults.quiet", timeout=3, max_attempts=100)
def quiet(event, ctx):
    with open(os.environ["TEST_EFFECTS_FILE"], "a") as out:
        out.write(f"{event.id}\n")


@cronbox.job("default", name="faults.write", tries=100, timeout=3)
def write(payload, ctx):
    ctx.session.execute(insert(effects).values(consumer="faults.write", event_id=payload["n"]))
    _gate("job")
