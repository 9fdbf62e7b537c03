"""Group commit in real processes: a crash anywhere in a group (CRONBOX_CRASH_AT, SIGKILL) loses
nothing and applies nothing twice; the next runs finish the work."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from sqlalchemy import func, select

import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.core.faults import CRASH_EXIT_CODE
from cronbox.outbox.events.models import Delivery
from cronbox.outbox.queue.models import Job
from tests.conftest import ONE_MYSQL_MODE, child_env, run_cli
from tests.handlers.effects import effects, metadata as effects_metadata
from tests.handlers.grouped import grouped_job
from tests.helpers import run_until, wait_for

# The claim mode is not these tests' subject (test_outbox, test_queue, test_tick and the crash tests run
# both): MariaDB once, so .ci/run stays under 30 minutes.
pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)

LEASE = 1.6  # the grouped handlers' timeout (0.5 s) + CRONBOX_LEASE_MARGIN=1, and a little


@pytest.fixture
def group_env(env, runtime):
    effects_metadata.create_all(runtime.engine)
    # A margin covers the group's time: a member joins only while its lease outlasts both.
    return {**env, "CRONBOX_HANDLERS": "tests.handlers.grouped", "CRONBOX_LEASE_MARGIN": "1",
            "CRONBOX_GROUP_MS": "200", "CRONBOX_GROUP_MAX": "5"}


def db_effects(runtime, consumer: str) -> Counter:
    with runtime.sessions() as session:
        return Counter(dict(session.execute(
            select(effects.c.event_id, func.count()).where(effects.c.consumer == consumer)
            .group_by(effects.c.event_id)).all()))


def unfinished(runtime) -> int:
    with runtime.sessions() as session:
        return (session.scalar(select(func.count()).select_from(Delivery).where(Delivery.status != "done"))
                + session.scalar(select(func.count()).select_from(Job).where(Job.status != "done")))


def leases_over(runtime) -> bool:
    """Has every lease a (crashed) run holds on a job ended?"""
    with runtime.sessions() as session:
        latest = session.scalar(select(func.max(Job.available_at)).where(Job.status == "reserved"))
    return latest is None or clock.utcnow() > latest


def finish(runtime, group_env, *command: str) -> None:
    def run() -> None:
        proc = run_cli(group_env, *command)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    run_until(run, lambda: unfinished(runtime) == 0, pause=LEASE)


@pytest.mark.slow
@pytest.mark.parametrize("step", ["after-claim", "in-handler", "before-ack-commit", "after-ack-commit"])
def test_a_crash_anywhere_in_a_group_loses_nothing_and_applies_once(runtime, group_env, step):
    with runtime.sessions.begin() as session:
        events = [cronbox.record(session, "gwork", {"n": n}) for n in range(30)]
        session.flush()
        ids = [e.id for e in events]
    rng = random.Random(f"{step}-{runtime.settings.database_url[:5]}")
    crashes = 0
    for nth in [rng.randint(2, 4) for _ in range(3)]:  # mostly a member past the first: mid-group
        proc = run_cli(group_env, "tick", "--no-linger", "--max-time", "30", CRONBOX_CRASH_AT=f"{step}:{nth}")
        assert proc.returncode in (0, CRASH_EXIT_CODE), proc.stdout + proc.stderr
        crashes += proc.returncode == CRASH_EXIT_CODE
        time.sleep(LEASE)  # the leases of what the crashed run held expire
    finish(runtime, group_env, "tick", "--no-linger")
    assert crashes >= 2, "the fault was hardly injected"
    assert unfinished(runtime) == 0
    assert db_effects(runtime, "grouped.db") == Counter({i: 1 for i in ids})  # exactly once


@pytest.mark.slow
@pytest.mark.parametrize("step, nth", [("in-handler", 3), ("before-ack-commit", 1)])
def test_a_crashed_worker_mid_group_loses_no_job_and_applies_once(runtime, group_env, step, nth):
    with runtime.sessions.begin() as session:
        for n in range(12):
            grouped_job.dispatch(session, {"n": n})
    # The crash must fall in the first group: its time (CRONBOX_GROUP_MS, capped by CRONBOX_ACK_FLUSH) and
    # the members' leases (a member joins while its lease covers its timeout and the group's time) long
    # enough for three members however loaded the machine. With 200 ms and a 1 s margin a loaded
    # machine's first group could end after two members, and commit them before the crash.
    env = {**group_env, "CRONBOX_GROUP_MS": "5000", "CRONBOX_ACK_FLUSH": "5s", "CRONBOX_LEASE_MARGIN": "10"}
    proc = run_cli(env, "queue", "work", "--queue", "gjobs", "--stop-when-empty", CRONBOX_CRASH_AT=f"{step}:{nth}")
    assert proc.returncode == CRASH_EXIT_CODE, proc.stdout + proc.stderr
    assert db_effects(runtime, "grouped.job") == Counter()  # the first group never committed
    wait_for(lambda: leases_over(runtime), "the crashed run's leases to end")
    finish(runtime, group_env, "queue", "work", "--queue", "gjobs", "--stop-when-empty")
    assert db_effects(runtime, "grouped.job") == Counter({n: 1 for n in range(12)})


@pytest.mark.slow
def test_random_sigkills_of_grouped_runs_lose_nothing(runtime, group_env):
    with runtime.sessions.begin() as session:
        events = [cronbox.record(session, "gwork", {"n": n}) for n in range(60)]
        session.flush()
        ids = [e.id for e in events]
    rng = random.Random(14)
    env = child_env({**group_env, "TEST_SLEEP": "0.01"})
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-m", "cronbox", "tick", "--max-time", "20"], env=env, cwd="/",
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.6, 1.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(LEASE)
    finish(runtime, group_env, "tick", "--no-linger")
    assert unfinished(runtime) == 0
    assert db_effects(runtime, "grouped.db") == Counter({i: 1 for i in ids})
