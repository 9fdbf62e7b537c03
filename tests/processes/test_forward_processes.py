"""Forwarding as cron runs it: tick processes killed at every boundary of the publisher and at
random, against the real RabbitMQ. At least once, duplicates identical, nothing acked unconfirmed,
per-key order kept; and a broker that hangs does not stop the tick's other work."""
from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
from collections import defaultdict

import pytest
from sqlalchemy import func, select

from cronbox import outbox
import cronbox
from cronbox.outbox.core.faults import CRASH_EXIT_CODE
from cronbox.outbox.events.models import Delivery
from tests.conftest import run_cli, start_cli
from tests.handlers import jobs as test_jobs
from tests.helpers import cronbox_log, run_until, table_column
from tests.rabbit import url

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

LEASE = 1.1  # the forward target's timeout (1 s) + CRONBOX_LEASE_MARGIN=0, and a little
KEYS = ["a", "b", "c", None]


@pytest.fixture
def fwd_env(env, runtime, rabbit):
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "fwd.#")
    return {**env, "CRONBOX_HANDLERS": "tests.handlers.forwarding", "TEST_AMQP_EXCHANGE": exchange,
            "CRONBOX_AMQP_URL": rabbit.url}, queue


def record(runtime, count: int) -> dict[int, tuple]:
    """Events fwd.n with keys a/b/c/none in turn; returns event id -> (trace id, key, payload)."""
    out = {}
    with runtime.sessions.begin() as session:
        events = [cronbox.record(session, "fwd.n", {"n": n}, key=KEYS[n % len(KEYS)]) for n in range(count)]
        session.flush()
        for n, e in enumerate(events):
            out[e.id] = (e.trace_id, e.key, {"n": n})
    return out


def pending(runtime) -> int:
    with runtime.sessions() as session:
        return session.scalar(select(func.count()).select_from(Delivery).where(Delivery.status != "done"))


def finish(env, runtime) -> None:
    """Clean ticks until every delivery is done (expired leases are claimed one at a time)."""
    def run() -> None:
        time.sleep(LEASE)
        proc = run_cli(env, "tick", "--no-linger", "--max-time", "30")
        assert proc.returncode == 0, proc.stderr[-2000:]

    run_until(run, lambda: pending(runtime) == 0, pause=0, seconds=240)


def check_arrivals(messages, recorded: dict[int, tuple]) -> int:
    """Every event at least once, each copy identical, per-key order of first arrivals kept.
    Returns the number of duplicates."""
    by_id = defaultdict(list)
    order = []
    for m in messages:
        mid = m.properties["message_id"]
        by_id[mid].append((m.body, m.properties["application_headers"].get("x-event-key")))
        if len(by_id[mid]) == 1:
            order.append(m.properties["application_headers"]["x-event-id"])
    expected = {f"cronbox-{eid}-{trace}": (json.dumps(payload, separators=(",", ":")), key)
                for eid, (trace, key, payload) in recorded.items()}
    assert set(by_id) == set(expected), "lost or foreign messages"
    for mid, copies in by_id.items():
        body, key = expected[mid]
        assert all((b.decode() if isinstance(b, bytes) else b, k) == (body, key) for b, k in copies)
    for key in KEYS[:-1]:
        ids = [eid for eid in order if recorded[eid][1] == key]
        assert ids == sorted(ids), f"key {key}: arrived out of order {ids}"
    return sum(len(c) - 1 for c in by_id.values())


@pytest.mark.parametrize("step", ["after-claim", "after-publish", "before-ack-commit", "after-ack-commit"])
def test_crash_at_every_boundary_of_the_publisher(fwd_env, runtime, rabbit, step):
    env, queue = fwd_env
    recorded = record(runtime, 12)
    proc = run_cli(env, "tick", "--no-linger", "--max-time", "30", CRONBOX_CRASH_AT=f"{step}:2")
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr[-2000:]
    finish(env, runtime)
    duplicates = check_arrivals(rabbit.take(queue), recorded)
    if step in ("after-claim",):
        assert duplicates == 0  # nothing of the crashed batch had been published
    if step == "before-ack-commit":
        assert duplicates >= 1  # confirmed, not acked: published again, same message_id
    # after-publish: written, confirms not read. Copies are possible, not certain: RabbitMQ may drop
    # publishes it had read and not yet routed when their connection dies with the process.


def test_a_delivery_whose_tick_dies_every_publish_is_dead_with_the_attempts_that_ran(fwd_env, runtime):
    """A forward target with max_attempts=3 whose tick is killed after publishing, before the confirms
    are read, three times: the fourth tick gives the delivery up without publishing it again, and the
    row, its error, the log line and `outbox dead` say 3 attempts (issue 35: the fourth claim's
    attempt, which never runs, was kept)."""
    env, _queue = fwd_env
    env = {**env, "TEST_FORWARD_MAX_ATTEMPTS": "3"}
    record(runtime, 1)
    codes = []
    for _ in range(6):
        proc = run_cli(env, "tick", "--no-linger", "--max-time", "30", CRONBOX_CRASH_AT="after-publish")
        codes.append(proc.returncode)
        if proc.returncode == 0:
            break
        time.sleep(LEASE)  # the killed run's lease expires
    assert codes == [CRASH_EXIT_CODE] * 3 + [0], proc.stderr[-2000:]
    with runtime.sessions() as session:
        [row] = session.scalars(select(Delivery))
    assert row.status == "dead" and row.attempts == 3
    assert row.last_error.startswith("gave up: attempt 3 of 3 was claimed but never finished")
    assert "outcome=dead attempt=3/3" in cronbox_log(runtime)
    listed = run_cli(env, "outbox", "dead")
    assert table_column(listed.stdout, "attempts") == ["3"] and "attempt 3 of 3" in listed.stdout, listed.stdout


def test_random_sigkills(fwd_env, runtime, rabbit):
    env, queue = fwd_env
    recorded = record(runtime, 300)
    rng = random.Random(11)
    for _ in range(6):
        proc = start_cli(env, "tick", "--no-linger", "--max-time", "30")
        time.sleep(rng.uniform(0.3, 1.2))
        proc.kill()
        proc.communicate()
        time.sleep(LEASE)
    finish(env, runtime)
    check_arrivals(rabbit.take(queue), recorded)


# How far past its --max-time a tick's own run may end while a broker hangs, blocks or never confirms:
# the item in hand, a batch's 1 s wait (the target's timeout) and a loaded machine's slowness. What it
# tells apart is a wait the run's time does not bound (a connect or confirm without the target's
# timeout, which a hanging broker makes endless).
PAST_MAX_TIME = 8


def _tick_with_jobs(env, runtime, tmp_path, amqp_url: str, max_time: str):
    with runtime.sessions.begin() as session:
        for n in range(3):
            test_jobs.record_run.job.dispatch(session, {"n": n})
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {**env, "CRONBOX_HANDLERS": "tests.handlers.forwarding,tests.handlers.jobs", "TEST_RUNS_DIR": str(runs),
           "CRONBOX_AMQP_URL": amqp_url}
    proc = run_cli(env, "tick", "--max-time", max_time)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = "".join(p.read_text() for p in runs.glob("runs-*.txt")).split("\n")
    assert sorted(line.split()[0] for line in lines if line) == ["0", "1", "2"], proc.stdout[-3000:]  # the jobs ran
    took = float(re.search(r" in ([0-9.]+)s \(stopped: max-time\)", proc.stdout + proc.stderr).group(1))
    return proc, took


def test_a_hanging_broker_does_not_stop_the_ticks_jobs_and_the_tick_exits_in_time(fwd_env, runtime, tmp_path):
    env, _queue = fwd_env
    hole = socket.create_server(("127.0.0.1", 0))
    accepted = []
    threading.Thread(target=lambda: accepted.append(hole.accept()), daemon=True).start()
    record(runtime, 3)
    # The tick's own time (the interpreter's start-up on a loaded machine is not the tick's): each
    # connect attempt waits at most the target's 1 s timeout, so the run ends soon after 6 s
    # (6: the built-in tasks run first, and on a loaded machine 4 s could leave the jobs no time).
    proc, took = _tick_with_jobs(env, runtime, tmp_path, url("x", hole.getsockname()[1]), "6")
    hole.close()
    assert took < 6 + PAST_MAX_TIME, proc.stderr[-3000:]
    with runtime.sessions() as session:
        rows = list(session.scalars(select(Delivery)))
    assert rows and all(d.status == "pending" and "broker unreachable" in d.last_error for d in rows)


def test_operator_commands_see_a_forward_target_like_any_consumer(fwd_env, runtime, rabbit):
    """Dead after its attempts (unroutable: no queue bound for the routing key), listed by `outbox dead`
    with the reason, counted by `outbox status`, revived by `outbox retry`, delivered once bound."""
    env, queue = fwd_env
    exchange = env["TEST_AMQP_EXCHANGE"]
    rabbit.channel.queue_unbind(queue, exchange, "fwd.#")
    env = {**env, "TEST_FORWARD_MAX_ATTEMPTS": "1"}
    with runtime.sessions.begin() as session:
        cronbox.record(session, "fwd.unbound", {"n": 1}, key="k")
        cronbox.record(session, "fwd.unbound", {"n": 2}, key="k")
    assert run_cli(env, "tick", "--no-linger").returncode == 0
    dead = run_cli(env, "outbox", "dead")
    assert "to-broker" in dead.stdout and "unroutable" in dead.stdout, dead.stdout
    status = run_cli(env, "outbox", "status")
    line = next(row for row in status.stdout.splitlines() if row.startswith("to-broker"))
    assert line.split()[1:5] == ["1", "1", "1", "1"], status.stdout  # pending (due, held back), dead, blocked keys
    late = rabbit.queue(exchange, "fwd.unbound", what="late")
    assert run_cli(env, "outbox", "retry", "--all").returncode == 0
    assert run_cli(env, "tick", "--no-linger").returncode == 0
    assert [json.loads(m.body)["n"] for m in rabbit.take(late)] == [1, 2]
    assert pending(runtime) == 0


def test_a_broker_that_never_confirms_costs_the_tick_nothing_but_the_wait(fwd_env, runtime, rabbit, tmp_path):
    """The proxy passes the batches to the broker and none of its answers back once publishing
    starts: nothing is acked, the deliveries retry with backoff, the jobs run, the tick ends in time."""
    from tests.tcp_proxy import TcpProxy

    env, queue = fwd_env
    record(runtime, 3)
    with TcpProxy(5672) as proxy:
        proxy.mute_on(b"\x00\x3c\x00\x28")  # the start of a basic.publish method frame
        proc, took = _tick_with_jobs(env, runtime, tmp_path, url(rabbit.vhost, proxy.port), "6")
    assert took < 6 + PAST_MAX_TIME, proc.stderr[-3000:]  # a batch waits its 1 s for its confirms, then settles
    with runtime.sessions() as session:
        rows = list(session.scalars(select(Delivery)))
    assert rows and all(d.status == "pending" and d.attempts >= 1 and "no confirm from the broker within 1s"
                        in d.last_error for d in rows)  # nothing acked
    assert rabbit.take(queue)  # the broker has them, unconfirmed: they will be published again


def test_the_connection_cut_mid_batch_in_a_tick_loses_nothing_and_the_jobs_run(fwd_env, runtime, rabbit, tmp_path):
    from tests.tcp_proxy import TcpProxy

    env, queue = fwd_env
    recorded = record(runtime, 12)
    with TcpProxy(5672) as proxy:
        proxy.cut_after(1500)  # the handshake (~350 bytes), then about four messages of the first batch
        proc, took = _tick_with_jobs(env, runtime, tmp_path, url(rabbit.vhost, proxy.port), "5")
        assert proxy.accepted == 2  # the cut, then one new connection for the retry
    assert pending(runtime) == 0  # retried after the backoff within the same tick
    check_arrivals(rabbit.take(queue), recorded)  # every event, in per-key order, copies identical
    logs = "".join(p.read_text() for p in runtime.settings.logs_dir.glob("cronbox-*.log"))
    assert "unconfirmed: connection lost" in logs  # the cut fell inside the batch, which went again
    # Copies are possible (what the broker routed before the cut goes again) but not certain: RabbitMQ may
    # drop publishes it had read and not yet routed when their connection dies (seen under load).
