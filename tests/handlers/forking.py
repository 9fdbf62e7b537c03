"""Handlers that fork and let the child leave the handler (CRONBOX_HANDLERS=tests.handlers.forking).

Each call appends "ran <handler> <payload n>" to TEST_EFFECTS_FILE; the parent waits for its child
and appends "child <case> <exit code>". The payload's "case" says how the child leaves the handler
(CHILD_CASES: the exit code a child ending that way must have). A child that came back into cronbox
would run other items' handlers again (more "ran" lines) and print a second summary.
"""
from __future__ import annotations

import multiprocessing
import os
import sys

import cronbox
from cronbox.cron.scheduling import schedule

# case -> the exit code of the child ending that way
CHILD_CASES = {
    "return": 0,
    "raise": 1,
    "system-exit-3": 3,
    "system-exit-none": 0,
    "sys-exit-text": 1,
    "keyboard-interrupt": 1,
    "double-fork": 0,
    "multiprocessing": 0,
}


def _note(line: str) -> None:
    with open(os.environ["TEST_EFFECTS_FILE"], "a") as out:
        out.write(line + "\n")


def _child_leaves(case: str):
    """In the child: leave the handler as `case` says."""
    if case == "return":
        return None
    if case == "raise":
        raise RuntimeError("child failed")
    if case == "system-exit-3":
        raise SystemExit(3)
    if case == "system-exit-none":
        sys.exit()
    if case == "sys-exit-text":
        sys.exit("child says bye")
    if case == "keyboard-interrupt":
        raise KeyboardInterrupt
    if case == "double-fork":  # the grandchild returns too; the child waits for it, then returns
        grandchild = os.fork()
        if grandchild:
            _, status = os.waitpid(grandchild, 0)
            _note(f"grandchild {os.waitstatus_to_exitcode(status)}")
        return None
    raise AssertionError(case)


def _mp_target(n: int) -> None:
    _note(f"mp-target {n}")


def fork_and_wait(name: str, case: str, n: int) -> None:
    _note(f"ran {name} {n}")
    if case == "multiprocessing":  # its child ends with os._exit itself, after the target
        process = multiprocessing.get_context("fork").Process(target=_mp_target, args=(n,))
        process.start()
        process.join(30)
        _note(f"child {case} {process.exitcode}")
        return
    pid = os.fork()
    if pid == 0:
        return _child_leaves(case)
    _, status = os.waitpid(pid, 0)
    _note(f"child {case} {os.waitstatus_to_exitcode(status)}")


@cronbox.consumer("fork", name="forking.consumer", timeout=20, max_attempts=1)
def forking_consumer(event, ctx):
    fork_and_wait("forking.consumer", event.payload["case"], event.payload["n"])


@cronbox.consumer("fork-grouped", name="forking.grouped", timeout=20, max_attempts=1, grouped=True)
def forking_grouped(event, ctx):
    fork_and_wait("forking.grouped", event.payload["case"], event.payload["n"])


@cronbox.job("fork", name="forking.job", timeout=20, tries=1)
def forking_job(payload, ctx):
    fork_and_wait("forking.job", payload["case"], payload["n"])


@cronbox.consumer("plain", name="forking.plain", timeout=20, max_attempts=1)
def plain_consumer(event, ctx):
    _note(f"ran forking.plain {event.payload['n']}")


@cronbox.job("plain", name="forking.plain_job", timeout=20, tries=1)
def plain_job(payload, ctx):
    _note(f"ran forking.plain_job {payload['n']}")


if os.environ.get("TEST_FORK_TASK"):
    # A yearly slot: it runs once on a fresh database, however long the tick (every minute ran it
    # twice in a tick that crossed a minute).
    @schedule.cron("0 0 1 1 *", name="forking.task")
    def forking_task(ctx):
        fork_and_wait("forking.task", os.environ["TEST_FORK_TASK"], 0)
