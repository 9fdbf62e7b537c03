"""A backlog of large payloads in a real `python -m cronbox tick` (issue 35): it drains in
ceil(N / fit) ticks, where fit is how many items a tick's --memory holds one at a time, and the
tick's peak RSS grows by a few payloads' worth, not by the backlog's. Before, the claim read up to
a hundred payloads at once: past --memory before any consumer ran, then one item a tick, each claim
reading the rest again. The claim's own rules, every backend: tests/db/test_large_payloads.py."""
from __future__ import annotations

import math
import shlex
import subprocess
import sys

import pytest
from sqlalchemy import func, select

import cronbox
from cronbox.outbox.engine.models import Heartbeat
from cronbox.outbox.events.models import Delivery
from cronbox.outbox.queue.models import Job
from tests.conftest import child_env
from tests.handlers import large_payloads

PAYLOAD_MB = 5
EVENTS, JOBS = 12, 4  # 80 MB of payloads: what a claim of the old kind read into one tick
ITEM_ROOM_MB = 8 * PAYLOAD_MB  # --memory above a tick of small items: room for one item at a time, not for the backlog
GROWTH_MB = 7 * PAYLOAD_MB  # what the tick's peak may grow by over that tick's: a few payloads' worth
HEADROOM_MB = 8  # admission's default memory headroom (CRONBOX_ADMISSION_MEMORY_HEADROOM)


@pytest.fixture
def large_env(env):
    return {**env, "CRONBOX_HANDLERS": "tests.handlers.large_payloads"}


def add_backlog(runtime, size: int) -> None:
    blob = "x" * size
    for _ in range(EVENTS):  # one transaction each: a MariaDB packet holds one large row at a time
        with runtime.sessions.begin() as session:
            cronbox.record(session, "large.made", {"size": size, "blob": blob})
    for _ in range(JOBS):
        with runtime.sessions.begin() as session:
            large_payloads.large_job.dispatch(session, {"size": size, "blob": blob})


def left(runtime) -> int:
    with runtime.sessions() as session:
        return (session.scalar(select(func.count()).select_from(Delivery).where(Delivery.status != "done"))
                + session.scalar(select(func.count()).select_from(Job).where(Job.status != "done")))


def tick(runtime, env, *args: str) -> tuple[str, int]:
    """One `tick --no-linger`: (its output, its peak RSS in KiB from its heartbeat row).

    Started as cron starts it, by /bin/sh, which forks it: exec'd straight from this process, the
    tick's peak (ru_maxrss, what the heartbeat records) would start at this test process's RSS."""
    command = " ".join(shlex.quote(arg) for arg in (sys.executable, "-m", "cronbox", "tick", "--no-linger", *args))
    proc = subprocess.run(["/bin/sh", "-c", f"{command}; exit $?"], env=child_env(env), cwd="/",
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    with runtime.sessions() as session:
        peak = session.scalars(select(Heartbeat.peak_rss_kb).where(Heartbeat.command == "tick")
                               .order_by(Heartbeat.id.desc()).limit(1)).one()
    return out, peak


def logs(runtime) -> str:
    return "".join(p.read_text() for p in sorted(runtime.settings.logs_dir.glob("cronbox-*.log")))


def test_a_backlog_of_large_payloads_drains_in_as_many_ticks_as_fit_with_rss_bounded(runtime, large_env):
    add_backlog(runtime, 100)  # the same backlog, small: the tick's own RSS with these handlers
    out, small_peak = tick(runtime, large_env)
    assert left(runtime) == 0, out

    add_backlog(runtime, PAYLOAD_MB * 2 ** 20)
    memory_mb = small_peak / 1024 + HEADROOM_MB + ITEM_ROOM_MB
    fit = EVENTS + JOBS  # each item fits alone: a tick takes them all, one claim and one payload at a time
    ticks = []
    while left(runtime) and len(ticks) < 8:
        ticks.append(tick(runtime, large_env, "--memory", f"{memory_mb:.0f}"))
    outputs = "\n".join(out for out, _peak in ticks)
    assert left(runtime) == 0 and len(ticks) == math.ceil((EVENTS + JOBS) / fit), outputs
    assert f"delivered {EVENTS}," in outputs and f"jobs done {JOBS}," in outputs and "deferred 0" in outputs, outputs
    assert "claimed but not started" not in logs(runtime)  # nothing given back: nothing read twice
    growth_mb = (max(peak for _out, peak in ticks) - small_peak) / 1024
    assert growth_mb <= GROWTH_MB, (f"peak RSS grew {growth_mb:.0f} MB over the small backlog's tick "
                                    f"(a {PAYLOAD_MB} MB payload each, {EVENTS + JOBS} of them)", outputs)
