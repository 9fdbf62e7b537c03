"""Consumers for the subprocess tests (CRONBOX_HANDLERS=tests.handlers.effects).

Behaviour comes from environment variables the test sets:
TEST_EFFECTS_FILE  the quiet consumer appends "<event id>" per call (an external effect)
TEST_INSIDE_FILE / TEST_RELEASE_FILE  the blocking consumer writes the first, waits for the second
TEST_SLEEP  seconds the "work" consumers sleep (for SIGKILL tests)
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, String, Table, insert

import cronbox
from cronbox.outbox.core.faults import crash_point

metadata = MetaData()
effects = Table("test_effects", metadata, Column("id", Integer, primary_key=True),
                Column("consumer", String(64)), Column("event_id", Integer))


def pause():
    seconds = float(os.environ.get("TEST_SLEEP") or 0)
    if seconds:
        time.sleep(seconds)


@cronbox.consumer("work", name="effects.db", timeout=0.5, max_attempts=100)
def db_writer(event, ctx):
    pause()
    crash_point("in-handler")
    ctx.session.execute(insert(effects).values(consumer="effects.db", event_id=event.id))


@cronbox.consumer("work", name="effects.quiet", timeout=0.5, max_attempts=100)
def quiet(event, ctx):
    pause()
    crash_point("in-handler")
    with open(os.environ["TEST_EFFECTS_FILE"], "a") as out:
        out.write(f"{event.id}\n")


@cronbox.consumer("poison", name="effects.poison", timeout=0.5, max_attempts=3)
def poison(event, ctx):
    os._exit(9)  # e.g. the host's memory limit killing us on this event, every time


def wait_for_release() -> None:
    """Write TEST_INSIDE_FILE (this pid), then wait (60 s at most) until the test writes TEST_RELEASE_FILE."""
    Path(os.environ["TEST_INSIDE_FILE"]).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    release = Path(os.environ["TEST_RELEASE_FILE"])
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@cronbox.consumer("block", name="effects.block", timeout=120)
def block(event, ctx):
    wait_for_release()


@cronbox.consumer("ping", name="effects.ping")
def ping(event, ctx):
    ctx.session.execute(insert(effects).values(consumer="effects.ping", event_id=event.id))
