"""Handlers that leave a non-daemon thread running (CRONBOX_HANDLERS=tests.handlers.threads).

The job "threads.linger" and, with TEST_THREAD_TASK set, the scheduled task "threads.task" start a
non-daemon thread (named "handler-sleeper-<n>") that sleeps 60 s: Python would wait for it at exit.
"""
from __future__ import annotations

import os
import threading
import time

import cronbox
from cronbox.cron.scheduling import schedule


def start_sleeper(n) -> None:
    threading.Thread(target=time.sleep, args=(60,), name=f"handler-sleeper-{n}", daemon=False).start()


@cronbox.job("threads", name="threads.linger", timeout=20, tries=1)
def linger(payload, ctx):
    start_sleeper(payload["n"])


if os.environ.get("TEST_THREAD_TASK"):
    # A yearly slot: it runs once on a fresh database, however long the tick (every minute ran it
    # twice in a tick that crossed a minute).
    @schedule.cron("0 0 1 1 *", name="threads.task")
    def linger_task(ctx):
        start_sleeper("task")
