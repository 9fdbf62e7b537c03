"""Batches and chains under random SIGKILLs (issue 39): two `queue work` workers and a tick, killed at
random, then clean runs: every batch's `then` and `finally` exactly once, after its last member; every
member's effect exactly once (a result-only member's result row once); every chain's three steps once,
in order, each with the step before's result.

CI size: 24 batches of 1-12 members and 24 chains, on MariaDB (both claim modes) and PostgreSQL, four
rounds of kills. The issue's full size (200 batches of 1-50 members, 200 chains) with TEST_CHAOS_FULL=1, killed
until every job is done."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from sqlalchemy import func, select

import cronbox
from cronbox.outbox.engine.models import Heartbeat
from cronbox.outbox.queue.models import Job
from tests.conftest import child_env, run_cli
from tests.handlers import batch_chaos
from tests.handlers.effects import effects, metadata as effects_metadata
from tests.helpers import run_until, wait_for

pytestmark = pytest.mark.backends("mysql-skip-locked", "mysql-token", "postgresql")

FULL = bool(os.environ.get("TEST_CHAOS_FULL"))
BATCHES, MAX_MEMBERS, CHAINS = (200, 50, 200) if FULL else (24, 12, 24)
# CI: CI_ROUNDS rounds of kills, then clean runs; a member takes 10 ms, so that the work outlasts a few
# rounds. Full size: kills until every job is done (20 min at most): the work runs under them.
CI_ROUNDS = 4
PAUSE = "0.002" if FULL else "0.01"
KILL_AFTER = (0.2, 3.0) if FULL else (0.1, 1.0)  # seconds into a round's runs when its kills land
LEASE = 2.2  # the handlers' timeout (1 s) + CRONBOX_LEASE_MARGIN=1, and a little


def counts(runtime, consumer: str) -> Counter:
    with runtime.sessions() as session:
        return Counter(dict(session.execute(select(effects.c.event_id, func.count())
                                            .where(effects.c.consumer == consumer)
                                            .group_by(effects.c.event_id)).all()))


def running(runtime) -> set[int]:
    """The pids of the runs that have started (their heartbeat row)."""
    with runtime.sessions() as session:
        return set(session.scalars(select(Heartbeat.pid)))


def unfinished(runtime) -> int:
    with runtime.sessions() as session:
        return session.scalar(select(func.count()).select_from(Job).where(Job.status != "done")) or 0


@pytest.mark.slow
def test_random_sigkills_lose_no_member_and_fire_every_callback_once_after_its_last(runtime, env):
    effects_metadata.create_all(runtime.engine)
    rng = random.Random(f"chaos-{runtime.settings.database_url[:5]}-{runtime.settings.claim_mode}")
    sizes = [rng.randint(1, MAX_MEMBERS) for _ in range(BATCHES)]
    quiet_ids, quiet_numbers = [], set()
    member_n = 0
    with runtime.sessions.begin() as session:
        for b, size in enumerate(sizes):
            batch = cronbox.batch(session, name=f"chaos {b}", then=batch_chaos.then, finally_=batch_chaos.finally_,
                                  payload=b)
            for _ in range(size):
                quiet = rng.random() < 0.3
                job_id = batch_chaos.member.dispatch(session, {"n": member_n, "quiet": quiet}, batch=batch)
                if quiet:
                    quiet_ids.append(job_id)
                    quiet_numbers.add(member_n)
                member_n += 1
        for c in range(CHAINS):
            cronbox.chain(session, [(batch_chaos.step1, c), (batch_chaos.step2, c), (batch_chaos.step3, c)])
    chaos_env = {**env, "CRONBOX_HANDLERS": "tests.handlers.batch_chaos", "CRONBOX_LEASE_MARGIN": "1",
                 "CRONBOX_QUEUES": "chaos", "TEST_SLEEP": PAUSE}
    started = time.monotonic()
    kills = 0
    rounds = 0
    while unfinished(runtime) and (time.monotonic() - started < 1200 if FULL else rounds < CI_ROUNDS):
        rounds += 1
        commands = [["queue", "work", "--queue", "chaos", "--max-time", "20"]] * 2 + [["tick", "--max-time", "20"]]
        procs = [subprocess.Popen([sys.executable, "-m", "cronbox", *command], env=child_env(chaos_env), cwd="/",
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for command in commands]
        # Past the imports and into the runs (each has written its heartbeat row; however loaded the machine,
        # a start-up is not what gets killed), then a random moment: kills land in claims, handlers, acks and
        # callbacks.
        wait_for(lambda: all(proc.poll() is not None for proc in procs if proc.pid not in running(runtime)),
                 "the chaos round's processes to start their runs", 120, pause=0.1)  # a query each: not too often
        time.sleep(rng.uniform(*KILL_AFTER))
        for proc in procs:
            if rng.random() < 0.8:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            else:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait()  # the leases the killed ones held (LEASE) run out while the next round starts up

    def clean() -> None:
        proc = run_cli(chaos_env, "queue", "work", "--queue", "chaos", "--stop-when-empty", timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    chaos_seconds, left = time.monotonic() - started, unfinished(runtime)
    run_until(clean, lambda: unfinished(runtime) == 0, pause=LEASE, seconds=600)
    # What the run did, for the record (pytest -s shows it): the full size's numbers go in the report.
    print(f"\nbatch chaos {runtime.settings.database_url.split(':')[0]} {runtime.settings.claim_mode}: {BATCHES} "
          f"batches, {member_n} members, {CHAINS} chains; {kills} kills in {rounds} rounds, {chaos_seconds:.0f} s, "
          f"{left} jobs left for the clean runs, done after {time.monotonic() - started:.0f} s")
    assert kills >= 3, "the chaos hardly happened"
    with runtime.sessions() as session:
        assert left < (session.scalar(select(func.count()).select_from(Job)) or 0), "no job finished during the chaos"
    loud = set(range(member_n)) - quiet_numbers
    assert quiet_ids and loud
    assert counts(runtime, "member") == Counter({n: 1 for n in loud})  # no member lost, none applied twice
    with runtime.sessions() as session:
        for job_id in quiet_ids:
            assert batch_chaos.member.result(session, job_id).status == "done"
    assert counts(runtime, "then") == Counter({b: 1 for b in range(BATCHES)})
    assert counts(runtime, "finally") == Counter({b: 1 for b in range(BATCHES)})
    assert counts(runtime, "early-then") == Counter() and counts(runtime, "early-finally") == Counter()
    for step in ("step1", "step2", "step3"):
        assert counts(runtime, step) == Counter({c: 1 for c in range(CHAINS)}), step
