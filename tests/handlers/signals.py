"""Handlers that change the stop signals' dispositions (CRONBOX_HANDLERS=tests.handlers.signals).

The payload's (or TEST_SIGNAL_TASK's) "case" is "<SIGNAL>:<ignore|default|own>": the handler sets that
signal to SIG_IGN, SIG_DFL or a function of its own and returns. The job "signals.block" then writes
TEST_INSIDE_FILE and waits for TEST_RELEASE_FILE, so that a test can signal the process while it runs.
"""
from __future__ import annotations

import os
import signal

import cronbox
from cronbox.cron.scheduling import schedule
from tests.handlers.effects import wait_for_release


def _own_handler(signum, frame):
    with open(os.environ["TEST_INSIDE_FILE"] + ".own", "a") as out:
        out.write(f"{signum}\n")


def meddle(case: str) -> None:
    name, _, disposition = case.partition(":")
    signal.signal(getattr(signal, name), {"ignore": signal.SIG_IGN, "default": signal.SIG_DFL,
                                          "own": _own_handler}[disposition])


@cronbox.consumer("meddle", name="signals.consumer", timeout=20, max_attempts=1)
def meddling_consumer(event, ctx):
    meddle(event.payload["case"])


@cronbox.consumer("meddle-grouped", name="signals.grouped", timeout=20, max_attempts=1, grouped=True)
def meddling_grouped(event, ctx):
    meddle(event.payload["case"])


@cronbox.job("sig", name="signals.job", timeout=20, tries=1)
def meddling_job(payload, ctx):
    meddle(payload["case"])


@cronbox.job("sig", name="signals.block", timeout=120, tries=1)
def block(payload, ctx):
    wait_for_release()


if os.environ.get("TEST_SIGNAL_TASK"):
    # A yearly slot: it runs once on a fresh database, however long the tick (every minute ran it
    # twice in a tick that crossed a minute).
    @schedule.cron("0 0 1 1 *", name="signals.task")
    def meddling_task(ctx):
        meddle(os.environ["TEST_SIGNAL_TASK"])
