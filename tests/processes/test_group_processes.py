"""Concurrency groups across real processes: a SIGKILLed slot holder's slot frees itself by its lease."""
from __future__ import annotations

import dataclasses
import signal
from datetime import timedelta

from sqlalchemy import select

from cronbox.outbox.core import clock
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.queue import groups
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import ConcurrencyGroupSlot, Job
import pytest

from tests.conftest import ONE_MYSQL_MODE, run_cli, start_cli
from tests.helpers import wait_for

# The claim mode is not these tests' subject (test_outbox, test_queue, test_tick and the crash tests run
# both): MariaDB once, so .ci/run stays under 30 minutes.
pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)


def block_job(registry: Registry):
    """tests.handlers.group_jobs' job as this process knows it (importing that module would register
    it in every test's default registry)."""
    return job("gq", name="group.block", timeout=60, concurrency_group="gslots", concurrency_limit=1,
               registry=registry)(lambda payload, ctx: None)


def test_a_sigkilled_holders_slot_is_free_once_its_lease_ran_out(runtime, env, tmp_path):
    inside = tmp_path / "inside"
    registry = Registry()
    jobs = registry.jobs
    block = block_job(registry)
    with runtime.sessions.begin() as session:
        block.dispatch(session, {"n": 1})
    proc = start_cli({**env, "CRONBOX_HANDLERS": "tests.handlers.group_jobs", "TEST_INSIDE_FILE": str(inside)},
                     "queue", "work", "--queue", "gq", "--stop-when-empty")
    try:
        wait_for(lambda: inside.exists() or proc.poll() is not None, "the job to hold its slot")
        assert proc.poll() is None, proc.communicate()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with runtime.sessions() as session:
        [slot] = session.scalars(select(ConcurrencyGroupSlot)).all()
        job = session.scalars(select(Job)).one()
    assert (slot.group_name, slot.slot, slot.pid, slot.holder) == ("gslots", 0, proc.pid, f"{job.id}:{job.claim_token}")
    assert slot.lease_until <= job.available_at  # never longer than the job's own lease
    now = clock.utcnow()
    taken = lambda at: in_transaction(runtime.sessions, lambda s: groups.take(  # noqa: E731
        s, "gslots", 1, "next", at + timedelta(seconds=30), at))
    assert taken(now) is not None  # the dead holder's lease still runs: the group is full
    with runtime.sessions() as session:
        assert [(u.name, u.limit, u.in_use, u.waiting) for u in groups.overview(session, jobs, now)] == [
            ("gslots", 1, 1, 0)]
        after = slot.lease_until + timedelta(seconds=1)
        assert [(u.in_use, u.waiting) for u in groups.overview(session, jobs, after)] == [(0, 0)]
    assert taken(slot.lease_until + timedelta(seconds=1)) is None  # its lease ran out: free, nothing leaked


def test_queue_groups_and_status_show_slots_waiting_jobs_and_budgets(runtime, env):
    env = {**env, "CRONBOX_HANDLERS": "tests.handlers.group_jobs", "CRONBOX_QUEUE_BUDGETS": "gq=10/m",
           "CRONBOX_GROUP_BUDGETS": "gslots=500/h"}
    block = block_job(Registry())
    with runtime.sessions.begin() as session:
        block.dispatch(session, {"n": 1})
        block.dispatch(session, {"n": 2})
    now = clock.utcnow()
    in_transaction(runtime.sessions, lambda s: groups.take(s, "gslots", 1, "h", now + timedelta(hours=1), now))
    budget = groups.budgets(dataclasses.replace(runtime.settings, raw=env))[("queue", "gq")]
    in_transaction(runtime.sessions, lambda s: budget.charge(s, 3, now))
    for command in ("groups", "status"):
        result = run_cli(env, "queue", command)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert next(line for line in lines if line.startswith("gslots ")).split() == ["gslots", "1", "1", "2"]
        queue_budget = next(line for line in lines if line.startswith("queue gq "))
        assert queue_budget.split()[2:5] in (["3", "10", "60s"], ["0", "10", "60s"])  # a minute may have turned
        assert next(line for line in lines if line.startswith("group gslots ")).split()[2:5] == ["0", "500", "3600s"]


def test_a_bad_budget_setting_is_one_clear_line(runtime, env):
    for command in (("groups",), ("work", "--queue", "gq", "--stop-when-empty")):
        result = run_cli({**env, "CRONBOX_HANDLERS": "tests.handlers.group_jobs", "CRONBOX_QUEUE_BUDGETS": "sms=lots"},
                         "queue", *command)
        assert result.returncode != 0
        assert "CRONBOX_QUEUE_BUDGETS: sms='lots' must look like 100/m" in result.stderr
        assert "Traceback" not in result.stderr


def test_four_worker_processes_never_run_more_than_the_groups_limit(runtime, env, tmp_path):
    """Real `queue work` processes, four at a time, each taking one job (--max-jobs 1) of 8 in a group of
    limit 2: the record the handlers append shows at most 2 running at once, and 2 did; all done, each
    on its first attempt (a refusal uses none)."""
    runs = tmp_path / "runs.txt"
    pair = job("gpair", name="group.pair", timeout=30, concurrency_group="gpair", concurrency_limit=2,
               registry=Registry())(lambda payload, ctx: None)
    with runtime.sessions.begin() as session:
        for n in range(8):
            pair.dispatch(session, {"n": n})
    worker_env = {**env, "CRONBOX_HANDLERS": "tests.handlers.group_jobs", "TEST_RUNS_FILE": str(runs),
                  "TEST_JOBS": "8", "CRONBOX_GROUP_WAIT": "0.05"}

    def start():
        return start_cli(worker_env, "queue", "work", "--queue", "gpair", "--max-jobs", "1", "--sleep", "0.05",
                         "--max-time", "120")

    def done() -> int:
        with runtime.sessions() as session:
            return sum(1 for j in session.scalars(select(Job)) if j.status == "done")

    procs = [start() for _ in range(4)]
    finished = []
    try:
        def keep_four():  # a worker that ran its one job exits; another takes its place
            for i, proc in enumerate(procs):
                if proc.poll() is not None:
                    finished.append(proc)
                    procs[i] = start()
            return done() == 8

        wait_for(keep_four, "all 8 jobs done", timeout=120)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.communicate(timeout=30)
    for proc in finished:
        out, err = proc.communicate()
        assert proc.returncode == 0, err
    running = peak = 0
    for line in runs.read_text().splitlines():
        running += 1 if line.startswith("start") else -1
        peak = max(peak, running)
    assert peak == 2, runs.read_text()
    with runtime.sessions() as session:
        assert [(j.status, j.attempts) for j in session.scalars(select(Job).order_by(Job.id))] == [("done", 1)] * 8
        assert session.scalars(select(ConcurrencyGroupSlot).where(ConcurrencyGroupSlot.holder.is_not(None))).all() == []
