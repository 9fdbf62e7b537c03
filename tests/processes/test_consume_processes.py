"""`python -m cronbox amqp consume` as a VPS runs it, against the real RabbitMQ: killed at every
boundary (CRONBOX_CRASH_AT) and at random (SIGKILL), stopped by SIGTERM mid-message, its dead
queue through the CLI, its one-line errors, and the whole path from a recorded event through a
tick's forward target to a consumer's row."""
from __future__ import annotations

import json
import random
import secrets
import signal
import socket
import time
from collections import Counter
from pathlib import Path

import amqp
import pytest
from sqlalchemy import func, select

import cronbox
from cronbox.outbox.core.faults import CRASH_EXIT_CODE
from cronbox.outbox.events.models import Redelivery
from tests.conftest import run_cli, start_cli
from tests.handlers.consuming import consumed, metadata as consumed_metadata
from tests.helpers import reaped, wait_for
from tests.processes.test_host_cron import host, paid_notes  # noqa: F401,F811  (the clinic host app fixture)
from tests.rabbit import url

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")


@pytest.fixture
def setup(env, runtime, rabbit, tmp_path):
    consumed_metadata.create_all(runtime.engine)
    queue = rabbit.name("in")
    rabbit.channel.queue_declare(queue, durable=True, auto_delete=False)
    rabbit.queues.append(queue)
    calls = tmp_path / "calls.txt"
    calls.touch()
    env = {**env, "CRONBOX_HANDLERS": "tests.handlers.consuming", "CRONBOX_AMQP_URL": rabbit.url,
           "TEST_CALLS_FILE": str(calls), "TEST_INSIDE_FILE": str(tmp_path / "inside"),
           "TEST_RELEASE_FILE": str(tmp_path / "release")}
    return env, queue, calls


def publish(rabbit, queue, n, *, message_id=None, **payload) -> str:
    mid = message_id or f"m-{n}-{secrets.token_hex(4)}"
    rabbit.channel.basic_publish(
        amqp.Message(json.dumps({"n": n, **payload}), content_type="application/json", delivery_mode=2,
                     message_id=mid, type="amqp.write", application_headers={"x-trace-id": f"trace{n}"}),
        exchange="", routing_key=queue)
    return mid


def rows(runtime) -> Counter:
    with runtime.sessions() as session:
        return Counter(tuple(r) for r in session.execute(select(consumed.c.consumer, consumed.c.n)))


def calls(path: Path) -> Counter:
    return Counter(tuple(line.split()[:2]) for line in path.read_text().splitlines())


CLEAN_RUNS_FOR = 180  # seconds of clean runs a test allows: far more than a loaded machine takes


def drain(env, queue, rabbit, *args: str) -> list[str]:
    """Clean consumer runs until the queue is empty (what a crash left unacked came back to it),
    however many a loaded machine needs; their summary lines."""
    deadline, summaries = time.monotonic() + CLEAN_RUNS_FOR, []
    while True:
        proc = run_cli(env, "amqp", "consume", "--queue", queue, *args, "--max-time", "3")
        assert proc.returncode == 0, proc.stderr[-2000:]
        summaries.append(proc.stdout)
        name, messages, _ = rabbit.channel.queue_declare(queue, passive=True)
        if messages == 0:
            return summaries
        assert time.monotonic() < deadline, f"{messages} messages still in {queue}"


def duplicates_in(summaries: list[str]) -> int:
    """The messages the inbox skipped as already handled, over the runs' summary lines ("... N duplicates")."""
    return sum(int(out.split(" duplicates")[0].rsplit(" ", 1)[1]) for out in summaries)


def declare_and_bind(env, queue: str, binding: str) -> None:
    """What the VPS side does first: `amqp consume --bind` declares its queue and binds it. Run until it
    has (its "connected" log line comes after both), then stopped by SIGTERM; not a run of --max-time 1,
    whose time a loaded machine's start could use up before the first connect: such a run ends,
    exit 0, having declared nothing."""
    proc = start_cli(env, "amqp", "consume", "--queue", queue, "--bind", binding, "--max-time", "120")
    logs = Path(env["CRONBOX_INSTANCE"]) / "logs"
    with reaped(proc):
        wait_for(lambda: proc.poll() is not None or "amqp consume: connected to" in "".join(
            path.read_text() for path in logs.glob("cronbox-*.log")), "the consumer to declare and bind its queue")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "stopped: signal" in out, out + err[-2000:]


def exactly_once(runtime, count: int) -> None:
    assert rows(runtime) == Counter({(c, n): 1 for c in ("consume.a", "consume.b") for n in range(count)})


@pytest.mark.parametrize("step", ["in-handler", "before-inbox-commit", "after-inbox-commit", "after-broker-ack"])
def test_crash_at_every_boundary_of_the_consumer(setup, runtime, rabbit, step):
    env, queue, calls_file = setup
    ids = [publish(rabbit, queue, n) for n in range(6)]
    publish(rabbit, queue, 0, message_id=ids[0])  # a duplicate, as the relay publishes after a crash
    nth = 1 if step == "after-broker-ack" else 3  # acks are batched: there may be one for all 7
    proc = run_cli(env, "amqp", "consume", "--queue", queue, "--max-time", "20", CRONBOX_CRASH_AT=f"{step}:{nth}")
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr[-2000:]
    drain(env, queue, rabbit)
    exactly_once(runtime, 6)
    assert rabbit.take(queue) == [] and rabbit.take(f"{queue}.dead") == []
    made = calls(calls_file)
    if step == "after-inbox-commit":
        # Message 2 committed, then the process died before its ack: the broker redelivered it and
        # the inbox skipped both consumers, so no consumer ran anything twice.
        assert set(made.values()) == {1}
    if step == "before-inbox-commit":
        assert max(made.values()) == 2  # called, rolled back by the crash, called again: one row


def test_a_crash_before_a_batched_ack_only_brings_its_messages_again(setup, runtime, rabbit):
    """The acks of messages handled in a row go out as one basic.ack multiple: killed just before
    it, every message it covered comes again, and the inbox skips all their consumers."""
    env, queue, calls_file = setup
    for n in range(12):
        publish(rabbit, queue, n)
    proc = run_cli(env, "amqp", "consume", "--queue", queue, "--prefetch", "20", "--max-time", "20",
                   CRONBOX_CRASH_AT="before-broker-ack:1")
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr[-2000:]
    summaries = drain(env, queue, rabbit, "--prefetch", "20")  # the twelve again, however many runs it takes
    assert duplicates_in(summaries) >= 1  # handled, committed, never acked: delivered again, skipped by the inbox
    exactly_once(runtime, 12)
    assert set(calls(calls_file).values()) == {1}  # no consumer ran twice
    assert rabbit.take(queue) == []


def test_a_crash_while_a_clean_stop_gives_back_what_it_read_ahead_leaves_a_copy_the_inbox_skips(setup, runtime,
                                                                                                  rabbit):
    """A clean stop republishes each message read ahead and acks its original after the confirm: killed
    in between, both copies come back (the original flagged redelivered) and each consumer runs once."""
    env, queue, calls_file = setup
    for n in range(6):
        publish(rabbit, queue, n)
    proc = run_cli(env, "amqp", "consume", "--queue", queue, "--max-messages", "1", "--max-time", "60",
                   CRONBOX_CRASH_AT="before-read-ahead-ack:1")
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr[-2000:]
    summaries = drain(env, queue, rabbit)
    assert duplicates_in(summaries) >= 1  # the two copies
    exactly_once(runtime, 6)
    assert set(calls(calls_file).values()) == {1}  # the second copy found its inbox rows
    assert rabbit.take(queue) == [] and rabbit.take(f"{queue}.dead") == []


def ready_in(rabbit, queue: str) -> int:
    """Messages ready in `queue` (0 while it does not exist)."""
    state = rabbit.state(queue)
    return 0 if state is None else state[0]


def restart_until_parked(env, runtime, rabbit, queue: str, *args: str, poison: int, expected: Counter) -> None:
    """Run the consumer again each time it dies, as systemd's Restart=always does, until the poison
    message is parked and the rest handled (`expected` rows): it must have been killed exactly 3 times,
    by message `poison`, then parked it in Q.dead. The run that gets there is stopped by SIGTERM once
    it has, never by a short --max-time: with --ordered a run ending by its time with the poison read
    ahead and not started gives it back flagged redelivered, like a message in hand when the process
    died, so the next run counts a death that was not one (without --ordered a clean stop republishes
    what it read ahead unflagged: Link.return_read_ahead)."""
    codes = []
    deadline = time.monotonic() + CLEAN_RUNS_FOR

    def finished() -> bool:
        return rows(runtime) == expected and ready_in(rabbit, f"{queue}.dead") == 1 and ready_in(rabbit, queue) == 0

    while True:
        proc = start_cli(env, "amqp", "consume", "--queue", queue, *args, "--max-redeliveries", "3",
                         "--max-time", "600")
        with reaped(proc):
            wait_for(lambda: proc.poll() is not None or finished(), "the consumer to die or finish the queue",
                     timeout=max(deadline - time.monotonic(), 1), pause=0.1)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        codes.append(proc.returncode)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, (codes, err[-2000:])
    assert codes.count(-signal.SIGKILL) == 3 and codes[-1] == 0 and "stopped: signal" in out, (codes, out)
    [dead] = rabbit.take(f"{queue}.dead")
    headers = dead.properties["application_headers"]
    assert json.loads(dead.body)["n"] == poison and headers["x-cronbox-redeliveries"] == 3
    assert headers["x-cronbox-reason"].startswith("killed the consumer 3 times")


def test_a_poison_message_is_parked_after_killing_the_consumer_n_times(setup, runtime, rabbit):
    """A message whose consumer SIGKILLs the process: restarted like systemd would, the consumer
    requeues it at the back each time it comes back, parks it on the 3rd, and handles the rest once."""
    env, queue, calls_file = setup
    for n in range(8):
        publish(rabbit, queue, n, **({"kill": 1} if n == 3 else {}))
    expected = Counter({(c, n): 1 for c in ("consume.a", "consume.b") for n in range(8) if n != 3})
    restart_until_parked(env, runtime, rabbit, queue, poison=3, expected=expected)
    assert rows(runtime) == expected
    assert rabbit.take(queue) == []


def test_ordered_a_poison_message_is_counted_in_the_database_and_parked_in_place(setup, runtime, rabbit):
    """--ordered cannot move a redelivered message to the back (later messages of its key would
    overtake it): its kill count is kept in cronbox_redeliveries instead. Restarted like systemd
    would, the consumer parks it on the 3rd death, then handles the rest once, in their order, and
    the count is gone."""
    env, _queue, calls_file = setup
    queue = rabbit.name("ordered")
    rabbit.channel.queue_declare(queue, durable=True, auto_delete=False, arguments={"x-single-active-consumer": True})
    rabbit.queues.append(queue)
    for n in range(5):
        publish(rabbit, queue, n, **({"kill": 1} if n == 1 else {}))
    expected = Counter({(c, n): 1 for c in ("consume.a", "consume.b") for n in range(5) if n != 1})
    restart_until_parked(env, runtime, rabbit, queue, "--ordered", poison=1, expected=expected)
    assert rows(runtime) == expected
    # In order: 0 before the poison message, 2-4 only after it was parked (none overtook it).
    made = [int(line.split()[1]) for line in calls_file.read_text().splitlines() if line.startswith("consume.a")]
    assert made == [0, 2, 3, 4]
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Redelivery)) == 0
    assert rabbit.take(queue) == []


def test_random_sigkills_never_repeat_a_db_effect(setup, runtime, rabbit):
    env, queue, _calls = setup
    for n in range(150):
        publish(rabbit, queue, n, sleep=0.01)
    rng = random.Random(11)
    for _ in range(5):
        proc = start_cli(env, "amqp", "consume", "--queue", queue, "--max-time", "30")
        time.sleep(rng.uniform(1.0, 2.5))  # the interpreter's start-up takes most of a second
        proc.kill()
        proc.communicate()
    drain(env, queue, rabbit)
    exactly_once(runtime, 150)


def test_sigterm_mid_message_finishes_commits_acks_and_exits_0(setup, runtime, rabbit, tmp_path):
    env, queue, _calls = setup
    publish(rabbit, queue, 1, hold=1)  # runs until the test releases it, after the signal
    second = publish(rabbit, queue, 2)
    proc = start_cli(env, "amqp", "consume", "--queue", queue, "--prefetch", "5")
    inside = Path(env["TEST_INSIDE_FILE"])
    deadline = time.monotonic() + 60
    while not inside.exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    Path(env["TEST_RELEASE_FILE"]).write_text("go")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "stopped: signal" in out
    assert rows(runtime) == Counter({("consume.a", 1): 1, ("consume.b", 1): 1})
    # The prefetched second message was never started: back in the queue, not lost, and not flagged
    # redelivered (republished unchanged: the next run must not count it as a consumer's death).
    [back] = rabbit.take(queue)
    assert back.properties["message_id"] == second and back.delivery_info["redelivered"] is False
    assert back.properties["application_headers"] == {"x-trace-id": "trace2"} and json.loads(back.body) == {"n": 2}
    log = "".join(p.read_text() for p in (tmp_path / "instance" / "logs").glob("*.log"))
    assert "amqp consume: 1 message(s) read ahead and not started given back" in log
    line = next(entry for entry in log.splitlines() if "outcome=done" in entry)
    assert "trace=trace1" in line and "consumers=consume.a:done,consume.b:done" in line and '"n"' not in line


def test_the_dead_queue_through_the_cli(setup, runtime, rabbit):
    env, queue, _calls = setup
    mid = publish(rabbit, queue, 5, permanent=1)
    assert run_cli(env, "amqp", "consume", "--queue", queue, "--max-messages", "1").returncode == 0
    for _ in range(2):  # listing twice: the first did not take it away
        listed = run_cli(env, "amqp", "dead", "--queue", queue)
        assert listed.returncode == 0, listed.stderr
        assert mid in listed.stdout and "consume.a: PermanentFailure: this one cannot work" in listed.stdout
        assert "amqp.write" in listed.stdout
    unknown = run_cli(env, "amqp", "retry-dead", "--queue", queue, "--message-id", "nope")
    assert unknown.returncode == 1 and unknown.stderr.strip() == "error: unknown parked message id(s): nope"
    neither = run_cli(env, "amqp", "retry-dead", "--queue", queue)
    assert neither.returncode == 2 and len(neither.stderr.strip().splitlines()) == 1
    moved = run_cli(env, "amqp", "retry-dead", "--queue", queue, "--all")
    assert moved.returncode == 0 and f"1 messages moved back to {queue}" in moved.stdout
    back = rabbit.take(queue)
    assert [m.properties["message_id"] for m in back] == [mid]
    assert "x-cronbox-attempts" not in back[0].properties["application_headers"]  # attempts reset
    assert "no parked messages" in run_cli(env, "amqp", "dead", "--queue", queue).stdout


@pytest.mark.backends("sqlite")  # refused before a row is read or written: the database changes nothing
def test_bad_input_and_an_unreachable_broker_are_one_line_errors(setup, rabbit):
    env, queue, _calls = setup
    hole = socket.create_server(("127.0.0.1", 0))
    port = hole.getsockname()[1]
    hole.close()
    down = {**env, "CRONBOX_AMQP_URL": url(rabbit.vhost, port)}
    cases = [
        (down, ["amqp", "dead", "--queue", queue], 1, "error: broker unreachable"),
        (down, ["amqp", "retry-dead", "--queue", queue, "--all"], 1, "error: broker unreachable"),
        # 10 s: a run whose time is up before its first connect ends without one (exit 0); 2 s left a loaded
        # machine's start that little. Unreachable, it tries until then (1 s, 2 s, 4 s apart).
        (down, ["amqp", "consume", "--queue", queue, "--max-time", "10"], 1, "error: broker unreachable"),
        ({**env, "CRONBOX_AMQP_URL": ""}, ["amqp", "consume", "--queue", queue], 1, "error: CRONBOX_AMQP_URL is not set"),
        ({**env, "CRONBOX_AMQP_URL": "http://x"}, ["amqp", "dead", "--queue", queue], 1, "error: CRONBOX_AMQP_URL must"),
        (env, ["amqp", "consume", "--queue", "amq.gen"], 2, "error: Invalid value for '--queue'"),
        (env, ["amqp", "consume", "--queue", queue, "--bind", ":x"], 2, "error: Invalid value for '--bind'"),
        (env, ["amqp", "consume", "--queue", rabbit.name("missing"), "--max-time", "60"], 1, "error: queue"),
        (env, ["amqp", "dead", "--queue", rabbit.name("missing")], 1, "error: no dead queue"),
        (env, ["amqp", "consume", "--queue", queue, "--ordered", "--max-time", "60"], 1, "x-single-active-consumer"),
    ]
    for environment, args, code, start in cases:
        proc = run_cli(environment, *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == code and len(lines) == 1 and start in lines[0], (args, proc.stderr[-1500:])


def test_end_to_end_a_recorded_event_reaches_the_consumer_through_a_tick_and_the_broker(setup, runtime, rabbit):
    env, _queue, _calls = setup
    exchange = rabbit.exchange()
    queue = rabbit.name("e2e")
    rabbit.queues.append(queue)
    # The VPS side declares and binds its queue (--bind), here before anything is published.
    declare_and_bind(env, queue, f"{exchange}:amqp.#")
    with runtime.sessions.begin() as session:  # the web request's transaction
        cronbox.record(session, "amqp.write", {"n": 41}, key="patient:41")
    tick = run_cli({**env, "CRONBOX_HANDLERS": "tests.handlers.consuming_forward", "TEST_AMQP_EXCHANGE": exchange},
                   "tick", "--no-linger")
    assert tick.returncode == 0, tick.stderr[-2000:]
    proc = run_cli(env, "amqp", "consume", "--queue", queue, "--max-messages", "1", "--max-time", "30")
    assert proc.returncode == 0 and "1 done" in proc.stdout, proc.stderr[-2000:]
    assert rows(runtime) == Counter({("consume.a", 41): 1, ("consume.b", 41): 1})


def test_inside_a_host_app_db_session_is_the_consumers_transaction(host, rabbit):
    """CRONBOX_APP=clinic:create_app: the clinic's consumer (Model.query, db.session, current_app) runs
    off the broker in a fresh app context, its db.session writes committed with the inbox row."""
    queue = rabbit.name("clinic")
    rabbit.channel.queue_declare(queue, durable=True, auto_delete=False)
    rabbit.queues.append(queue)
    appointment = host.pay("Ada")
    [(payload, trace)] = host.rows("SELECT payload, trace_id FROM cronbox_events WHERE type = 'appointment.paid'")
    for _ in range(2):  # and a duplicate
        rabbit.channel.basic_publish(amqp.Message(payload, message_id=f"clinic-{trace}", type="appointment.paid",
                                                  application_headers={"x-trace-id": trace}),
                                     exchange="", routing_key=queue)
    proc = host.cron("amqp", "consume", "--queue", queue, "--max-messages", "2", CRONBOX_AMQP_URL=rabbit.url)
    assert proc.returncode == 0 and "1 done, 1 duplicates" in proc.stdout, proc.stdout + proc.stderr
    assert host.notes(appointment) == paid_notes(appointment) and host.status(appointment) == "paid"
    assert host.rows("SELECT consumer, message_id FROM cronbox_inbox") == [("clinic.receipt", f"clinic-{trace}")]
