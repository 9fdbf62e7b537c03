"""Jobs on RabbitMQ as hosts run them: ticks publishing (`tick`) and `python -m cronbox amqp work`
processes running, against the real broker: SIGTERM mid-job, health's heartbeat check, one-line
refusals, and the issue's acceptance run: thousands of jobs in committed transactions over three
queues, two broker workers, random SIGKILLs of the publishing ticks and of the workers, and every
job's database effect exactly once."""
from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

import cronbox
from cronbox.outbox.queue.models import Job
from tests.conftest import run_cli, start_cli
from tests.handlers.consuming import consumed, metadata as consumed_metadata
from tests.helpers import run_until

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

QUEUES = ("sms", "mail", "report")  # tests.handlers.broker_jobs's
J = Job.__table__


@pytest.fixture
def setup(env, runtime, registry, rabbit, tmp_path):
    consumed_metadata.create_all(runtime.engine)
    prefix = rabbit.name("jobs")
    rabbit.queues += [f"{prefix}.{q}" for q in QUEUES]
    (tmp_path / "calls.txt").touch()
    env = {**env, "CRONBOX_HANDLERS": "tests.handlers.broker_jobs", "CRONBOX_AMQP_URL": rabbit.url,
           "TEST_BROKER_PREFIX": prefix, "TEST_CALLS_FILE": str(tmp_path / "calls.txt"),
           "TEST_INSIDE_FILE": str(tmp_path / "inside"), "TEST_RELEASE_FILE": str(tmp_path / "release"),
           "CRONBOX_LEASE_MARGIN": "1", "TEST_REPUBLISH_AFTER": "15"}
    # The same names and queues as the worker's jobs, in this test's registry: dispatch only needs those.
    for queue in QUEUES:
        cronbox.job(queue, name=f"broker.{queue}", registry=registry)(lambda payload, ctx: None)
    cronbox.job("sms", name="broker.held", registry=registry)(lambda payload, ctx: None)
    return env, prefix


def dispatch(runtime, registry, queue, payloads, *, rollback=False, handler: str | None = None) -> None:
    job = registry.jobs.get(handler or f"broker.{queue}")
    with runtime.sessions() as session:
        for payload in payloads:
            job.dispatch(session, payload)
        (session.rollback if rollback else session.commit)()


def effects(runtime) -> Counter:
    with runtime.sessions() as session:
        return Counter(tuple(r) for r in session.execute(select(consumed.c.consumer, consumed.c.n)))


def statuses(runtime) -> Counter:
    with runtime.sessions() as session:
        return Counter(dict(session.execute(select(J.c.status, func.count()).group_by(J.c.status)).all()))


def tick(env) -> None:
    proc = run_cli(env, "tick", "--no-linger")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_sigterm_mid_job_finishes_it_and_gives_back_what_was_read_ahead(setup, runtime, registry, rabbit):
    env, prefix = setup
    dispatch(runtime, registry, "sms", [{"n": 1}], handler="broker.held")  # runs until the test releases it
    dispatch(runtime, registry, "sms", [{"n": 2}, {"n": 3}])
    tick(env)
    proc = start_cli(env, "amqp", "work", "--queue", "sms", "--prefetch", "5")
    inside = Path(env["TEST_INSIDE_FILE"])
    deadline = time.monotonic() + 60
    while not inside.exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    health = run_cli(env, "health")
    assert "broker-worker.sms" in health.stdout and "running the jobs of sms" in health.stdout, health.stdout
    proc.send_signal(signal.SIGTERM)  # while the first job still runs, however long health took
    Path(env["TEST_RELEASE_FILE"]).write_text("go")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "1 done" in out and "stopped: signal" in out
    assert effects(runtime) == Counter({("sms", 1): 1})
    # The two read ahead, never started, used no attempt: back on the broker as they were sent (taken
    # with the first or not), their rows reserved under their messages' tokens: no tick needed.
    with runtime.sessions() as session:
        left = session.execute(select(J.c.status, J.c.attempts, J.c.reserved_at).where(J.c.status != "done")).all()
    assert [tuple(r) for r in left] == [("reserved", 0, None)] * 2
    again = run_cli(env, "amqp", "work", "--queue", "sms", "--stop-when-empty", "--max-time", "30")
    assert again.returncode == 0 and "2 done" in again.stdout, again.stderr[-2000:]
    assert effects(runtime) == Counter({("sms", n): 1 for n in (1, 2, 3)})
    with runtime.sessions() as session:
        assert set(session.scalars(select(J.c.attempts))) == {1}
    health = run_cli(env, "health")
    assert "amqp work on sms ended" in health.stdout and "(empty)" in health.stdout, health.stdout


def test_a_job_that_kills_its_worker_fails_after_its_tries_and_its_neighbours_run(setup, runtime, registry):
    env, _prefix = setup
    cronbox.job("sms", name="broker.poison", registry=registry)(lambda payload, ctx: None)
    dispatch(runtime, registry, "sms", [{"n": n} for n in range(3)])
    with runtime.sessions() as session:
        registry.jobs.get("broker.poison").dispatch(session, {"n": 99})
        session.commit()
    dispatch(runtime, registry, "sms", [{"n": n} for n in range(3, 6)])
    codes = []

    def round_of_runs() -> None:
        tick(env)  # publishes what is due, and again what a killed worker held once its lease ended
        codes.append(run_cli(env, "amqp", "work", "--queue", "sms", "--stop-when-empty", "--max-time", "20").returncode)

    # As many rounds as a loaded machine needs (each starts two interpreters), bounded in time.
    run_until(round_of_runs, lambda: not statuses(runtime)["ready"] + statuses(runtime)["reserved"], pause=1.0)
    assert -signal.SIGKILL in codes, codes
    with runtime.sessions() as session:
        rows = {r.handler: r for r in session.execute(select(J).where(J.c.handler == "broker.poison"))}
        jobs = Counter((r.status, r.attempts) for r in session.execute(select(J).where(J.c.handler != "broker.poison")))
    poison = rows["broker.poison"]
    # tries=2: the attempts that ran, not the claim's that gave it up without running (issue 35)
    assert poison.status == "failed" and poison.attempts == 2
    assert poison.last_error.startswith("gave up: attempt 2 of 2 was claimed but never finished")
    # Taken with the poison once, a neighbour loses that one attempt at most; sent again, each is taken
    # alone, so the poison's later kills cost nobody else.
    assert sum(jobs.values()) == 6 and {status for status, _ in jobs} == {"done"}
    assert max(attempts for _, attempts in jobs) <= 2
    assert effects(runtime) == Counter({("sms", n): 1 for n in range(6)})


@pytest.mark.backends("sqlite")  # refused before any row is read: the database changes nothing
def test_what_cannot_run_is_one_line_and_a_non_zero_exit(setup):
    env, prefix = setup
    local = {**env, "CRONBOX_HANDLERS": "tests.handlers.consuming"}
    cases = [
        (env, ["amqp", "work", "--queue", "nowhere"], 1, "error: queue 'nowhere' is not forwarded to RabbitMQ"),
        (local, ["amqp", "work", "--queue", "sms"], 1, "error: queue 'sms' is not forwarded to RabbitMQ"),
        ({**env, "CRONBOX_AMQP_URL": ""}, ["amqp", "work", "--queue", "sms"], 1, "error: CRONBOX_AMQP_URL is not set"),
        (env, ["queue", "work", "--queue", "sms", "--stop-when-empty"], 2, "amqp work --queue sms"),
        (env, ["amqp", "work", "--queue", "sms", "--prefetch", "0"], 2, "error: Invalid value for '--prefetch'"),
        (env, ["amqp", "work", "--queue", f"{prefix}-celery"], 1, "is forwarded as Celery task messages"),
        # It would refuse the messages of a queue it does not run: it runs every queue of its broker queues.
        ({**env, "TEST_SHARED_BROKER_QUEUE": "1"}, ["amqp", "work", "--queue", "mail"], 1,
         f"error: broker queue '{prefix}.mail' also carries the jobs of queue 'digest'"),
    ]
    for environment, args, code, start in cases:
        proc = run_cli(environment, *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == code and len(lines) == 1 and start in lines[0], (args, proc.stderr[-1500:])


STALLED = 120


@pytest.mark.slow
@pytest.mark.timeout(1800)  # its clean runs are bounded by their progress (STALLED), not by the suite's 300 s
@pytest.mark.backends("mysql-skip-locked")  # the acceptance run once, on the server our users have; the
# token-guarded take, ack and publish SQL run on every backend in tests/db/test_broker_jobs.py
def test_thousands_of_jobs_two_workers_random_sigkills_every_effect_exactly_once(setup, runtime, registry, rabbit):
    env, prefix = setup
    count = 5000
    for start in range(0, count, 250):  # committed transactions of 250 jobs, the queues taking turns
        for queue in QUEUES:
            dispatch(runtime, registry, queue, [{"n": n} for n in range(start, start + 250) if n % 3 == QUEUES.index(queue)])
    for queue in QUEUES:  # rolled back: never published, never run
        dispatch(runtime, registry, queue, [{"n": -n} for n in range(1, 50)], rollback=True)
    work = ["amqp", "work", *[a for q in QUEUES for a in ("--queue", q)], "--prefetch", "20", "--max-time", "60"]
    rng = random.Random(28)
    workers = [start_cli(env, *work) for _ in range(2)]
    ticks = start_cli(env, "tick", "--max-time", "60")
    kills = Counter()
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and statuses(runtime)["done"] < count:
        time.sleep(rng.uniform(0.8, 2.0))
        victim = rng.choice(["tick", "worker0", "worker1"])
        proc = ticks if victim == "tick" else workers[int(victim[-1])]
        proc.kill()
        proc.communicate()
        kills[victim] += 1
        if victim == "tick":
            ticks = start_cli(env, "tick", "--max-time", "60")
        else:
            workers[int(victim[-1])] = start_cli(env, *work)
    for proc in [ticks, *workers]:
        proc.kill()
        proc.communicate()
    assert kills["tick"] and kills["worker0"] + kills["worker1"], kills
    # Clean runs until every job is done: what a kill left reserved is published again once its lease
    # runs out (the publish's, or republish_after), and runs once. Bounded by progress, not by a window
    # of time: a loaded machine takes minutes for what a quiet one does in seconds, but a round that
    # gets no job done for STALLED seconds (far past any lease, 15 s at most) is a defect.
    done, progressed = statuses(runtime)["done"], time.monotonic()
    while done < count and time.monotonic() - progressed < STALLED:
        tick(env)
        proc = run_cli(env, "amqp", "work", *work[2:-2], "--stop-when-empty", "--max-time", "20")
        assert proc.returncode == 0, proc.stderr[-2000:]
        if statuses(runtime)["done"] > done:
            done, progressed = statuses(runtime)["done"], time.monotonic()
        time.sleep(0.5)
    assert statuses(runtime) == Counter({"done": count}), (statuses(runtime), kills)
    assert effects(runtime) == Counter({(QUEUES[n % 3], n): 1 for n in range(count)})
    with runtime.sessions() as session:  # an attempt is counted when a worker takes a job, and only then
        attempts = Counter(session.scalars(select(J.c.attempts)))
    assert max(attempts) <= 1 + kills["worker0"] + kills["worker1"], (attempts, kills)
