"""Consuming a RabbitMQ queue in-process, on SQLite and MariaDB, against the real broker: the inbox,
retries through the TTL queues, parking, moving back, RetryLater, bad messages, --ordered, and the
connection cut or closed by the broker."""
from __future__ import annotations

import json
import secrets
import threading
import time

import amqp
import pytest
from sqlalchemy import func, select

import cronbox
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.models import Heartbeat
from cronbox.outbox.events import inbox, queues
from cronbox.outbox.amqp.broker import parse_url
from cronbox.outbox.events.consume import QueueConsumer
from cronbox.outbox.amqp.consumer_link import SetupError
from cronbox.outbox.events.incoming import MAX_BODY
from cronbox.outbox.events.parked import DeadQueue
from tests.broker_rows import inbox_count, inbox_has
from tests.db.test_hostile_handlers import SESSION_CASES
from tests.handlers import hostile
from tests.handlers.consuming import consumed, metadata as consumed_metadata
from tests.helpers import wait_for
from tests.rabbit import url
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")


class Behaviour:
    """What the test's consumers do, changed by the test between runs."""

    def __init__(self):
        self.fail_a = 0  # consumer a fails while ctx.attempt <= this
        self.permanent = False
        self.later = 0  # consumer a answers RetryLater to its next this many calls
        self.calls: list[tuple[str, int, int, float]] = []  # (consumer, n, attempt, time)


@pytest.fixture
def behaviour(runtime, registry):
    b = Behaviour()
    consumed_metadata.create_all(runtime.engine)

    def write(name, event, ctx):
        b.calls.append((name, event.payload.get("n"), ctx.attempt, time.monotonic()))
        ctx.session.execute(consumed.insert().values(consumer=name, n=event.payload.get("n"), attempt=ctx.attempt))

    @cronbox.consumer("amqp.write", name="a", max_attempts=3, backoff=[0.5, 1.0], timeout=10, runs="broker",
                     registry=registry)
    def a(event, ctx):
        write("a", event, ctx)
        if b.permanent:
            raise cronbox.PermanentFailure("cannot work")
        if ctx.attempt <= b.fail_a:
            raise RuntimeError(f"failing attempt {ctx.attempt}")
        if b.later:
            b.later -= 1
            raise cronbox.RetryLater(0.2, "not yet")

    @cronbox.consumer("amqp.write", name="b", max_attempts=3, backoff=[0.5, 1.0], timeout=10, runs="broker",
                     registry=registry)
    def b_(event, ctx):
        write("b", event, ctx)

    cronbox.forward("amqp.*", exchange="elsewhere", name="fwd", registry=registry)  # never run by the consumer
    return b


@pytest.fixture
def queue(rabbit):
    name = rabbit.name("in")
    rabbit.channel.queue_declare(name, durable=True, auto_delete=False)
    rabbit.queues.append(name)
    return name


def publish(rabbit, queue, n=0, *, message_id=None, body=None, key=None, props=None, **payload) -> str:
    mid = f"m-{secrets.token_hex(6)}" if message_id is None else message_id
    properties = {"content_type": "application/json", "delivery_mode": 2, "message_id": mid, "type": "amqp.write",
                  "application_headers": {"x-event-type": "amqp.write", "x-trace-id": f"tr{n}",
                                          **({"x-event-key": key} if key else {})}}
    properties.update(props or {})
    properties = {k: v for k, v in properties.items() if v is not None}
    rabbit.channel.basic_publish(amqp.Message(json.dumps({"n": n, **payload}) if body is None else body,
                                              **properties), exchange="", routing_key=queue)
    return mid


def consume(runtime, rabbit, queue, *, messages=None, max_time=20.0, amqp_url=None, **options):
    consumer = QueueConsumer(runtime, parse_url(amqp_url or rabbit.url), queue, **options)
    result = consumer.run(Budget(max_time=max_time, memory_mb=None, max_handled=messages))
    return consumer, result


def rows(runtime) -> list[tuple[str, int, int]]:
    with runtime.sessions() as session:
        return [tuple(r) for r in session.execute(select(consumed.c.consumer, consumed.c.n, consumed.c.attempt)
                                                  .order_by(consumed.c.id))]


def queue_exists(rabbit, name) -> bool:
    return rabbit.state(name) is not None


def consumers_on(rabbit, name) -> int:
    """How many consumers the queue has (0 while it does not exist)."""
    state = rabbit.state(name)
    return 0 if state is None else state[1]


def test_each_consumer_commits_once_duplicates_are_acked_without_a_call(runtime, rabbit, queue, behaviour):
    first = publish(rabbit, queue, 1)
    publish(rabbit, queue, 1, message_id=first)  # the relay published it twice (crash before its ack)
    publish(rabbit, queue, 2)
    consumer, result = consume(runtime, rabbit, queue, messages=3)
    assert result.stop_reason == "max-messages" and result.exit_code == 0
    assert sorted(rows(runtime)) == [("a", 1, 1), ("a", 2, 1), ("b", 1, 1), ("b", 2, 1)]
    assert [c[:2] for c in behaviour.calls].count(("a", 1)) == 1  # the duplicate never called anyone
    assert consumer.stats.done == 2 and consumer.stats.duplicates == 1
    assert rabbit.take(queue) == []  # all acked
    with runtime.sessions() as session:
        assert inbox_count(session) == 4 and inbox_has(session, "a", first)
        beat = session.scalars(select(Heartbeat).where(Heartbeat.command == "amqp consume")).one()
    assert (beat.detail, beat.outcome, beat.delivered) == (queue, "max-messages", 2) and beat.beat_at is not None


@pytest.mark.parametrize("case", sorted(SESSION_CASES))
def test_what_a_handler_does_to_ctx_session_keeps_its_meaning_and_the_inbox_row(runtime, registry, rabbit, queue,
                                                                                 case):
    """The consumer's ctx.session joins the attempt's transaction without a savepoint (the inbox
    row is its first statement): rollback(), close() and commit() keep the meaning they have in the
    relay and the worker (tests/db/test_hostile_handlers.py), and a rollback() that took the inbox
    row with it still leaves the row committed with the handler's writes: a second copy of a message
    that was handled is acked without a call."""
    steps, outcome, kept = SESSION_CASES[case]
    hostile.metadata.create_all(runtime.engine)
    calls = []

    @cronbox.consumer("amqp.session", name="session", backoff=[600], registry=registry)
    def session(event, ctx):
        calls.append(event.payload["n"])
        steps(ctx)

    copies = 2 if outcome == "done" else 1
    mid = f"m-{secrets.token_hex(6)}"
    for _ in range(copies):
        publish(rabbit, queue, 1, message_id=mid, props={"type": "amqp.session"})
    consumer, result = consume(runtime, rabbit, queue, messages=copies)
    assert result.exit_code == 0
    with runtime.sessions() as s:
        tags = sorted(s.scalars(select(hostile.rows.c.tag)))
        taken = inbox_has(s, "session", mid)
    assert tags == sorted(kept)
    if outcome == "done":
        assert calls == [1] and taken
        assert consumer.stats.done == 1 and consumer.stats.duplicates == 1
    else:
        assert calls == [1] and consumer.stats.retried == 1
        assert taken == (case == "commit-now-then-fail")  # commit_now() commits the inbox row with its writes


def test_a_failure_waits_in_a_ttl_queue_and_reruns_only_the_consumer_that_failed(runtime, rabbit, queue, behaviour):
    behaviour.fail_a = 2
    publish(rabbit, queue, 7)
    consumer, _ = consume(runtime, rabbit, queue, messages=3)  # the original and its two retries
    assert rows(runtime) == [("b", 7, 1), ("a", 7, 3)]  # a's failed attempts rolled back; b ran once
    a_calls = [c for c in behaviour.calls if c[0] == "a"]
    assert [c[2] for c in a_calls] == [1, 2, 3]
    assert [c[0] for c in behaviour.calls].count("b") == 1
    # The backoff's delays, through Q.retry.500ms and Q.retry.1000ms, dead-lettered back to Q.
    assert a_calls[1][3] - a_calls[0][3] >= 0.5 and a_calls[2][3] - a_calls[1][3] >= 1.0
    assert queue_exists(rabbit, f"{queue}.retry.500ms") and queue_exists(rabbit, f"{queue}.retry.1000ms")
    assert consumer.stats.retried == 2 and consumer.stats.done == 1


def test_out_of_attempts_parks_with_the_reason_and_retry_dead_moves_it_back(runtime, rabbit, queue, behaviour):
    behaviour.fail_a = 99
    mid = publish(rabbit, queue, 3, key="patient:3")
    consumer, _ = consume(runtime, rabbit, queue, messages=3)
    assert consumer.stats.parked == 1 and rabbit.take(queue) == []
    address = parse_url(rabbit.url)
    with DeadQueue(address, queue) as dq:
        listed, total = dq.list(10)
    with DeadQueue(address, queue) as dq:  # listing took nothing away
        again, _ = dq.list(10)
    assert total == 1 and listed == again
    parked = listed[0]
    assert (parked.message_id, parked.type, parked.key, parked.attempts) == (mid, "amqp.write", "patient:3", 3)
    assert parked.reason == "a: RuntimeError: failing attempt 3" and parked.parked_at
    behaviour.fail_a = 0
    with DeadQueue(address, queue) as dq:
        assert dq.move_back(["unknown-id", mid]) == (1, ["unknown-id"])
    consume(runtime, rabbit, queue, messages=1)
    assert rows(runtime) == [("b", 3, 1), ("a", 3, 1)]  # attempts reset; b did not run again
    with DeadQueue(address, queue) as dq:
        assert dq.list(10) == ([], 0)


def test_permanent_failure_parks_at_once(runtime, rabbit, queue, behaviour):
    behaviour.permanent = True
    publish(rabbit, queue, 4)
    consumer, _ = consume(runtime, rabbit, queue, messages=1)
    assert consumer.stats.parked == 1 and consumer.stats.retried == 0
    dead = rabbit.take(queues.dead_queue(queue))
    headers = dead[0].properties["application_headers"]
    assert headers[queues.REASON] == "a: PermanentFailure: cannot work" and headers[queues.FAILED] == "a"
    assert headers[queues.ATTEMPTS] == 1 and json.loads(dead[0].body) == {"n": 4}


def test_retry_later_waits_without_using_an_attempt(runtime, rabbit, queue, behaviour):
    behaviour.later = 2
    publish(rabbit, queue, 5)
    consumer, result = consume(runtime, rabbit, queue, messages=3, max_time=60)  # the message and its two returns
    assert result.stop_reason == "max-messages"
    assert ("a", 5, 1) in rows(runtime)  # still attempt 1, however often it was deferred
    assert [c[2] for c in behaviour.calls if c[0] == "a"] == [1, 1, 1] and consumer.stats.deferred == 2
    assert consumer.stats.done == 1 and consumer.stats.retried == 0
    assert queue_exists(rabbit, f"{queue}.retry.500ms")  # RetryLater(0.2): the backoff's smallest delay >= 0.2


def test_bad_messages_are_parked_with_a_reason_and_never_block_the_queue(runtime, rabbit, queue, behaviour):
    publish(rabbit, queue, body=b"{not json")
    publish(rabbit, queue, body=b"\xff\xfe{}")
    publish(rabbit, queue, message_id="")
    publish(rabbit, queue, message_id="x" * (NAME_MAX + 1))
    publish(rabbit, queue, props={"type": "no.such.type", "application_headers": {}})
    publish(rabbit, queue, props={"type": None, "application_headers": {}})
    publish(rabbit, queue, body=b" " * (MAX_BODY + 1))
    publish(rabbit, queue, 8)
    consumer, result = consume(runtime, rabbit, queue, messages=8)
    assert result.exit_code == 0 and consumer.stats.bad == 7 and consumer.stats.done == 1
    assert rows(runtime) == [("a", 8, 1), ("b", 8, 1)]
    with DeadQueue(parse_url(rabbit.url), queue) as dq:
        reasons = [p.reason for p in dq.list(20)[0]]
    assert reasons == ["bad message: body is not JSON (UTF-8)", "bad message: body is not JSON (UTF-8)",
                       "bad message: no message_id",
                       f"bad message: message_id longer than {NAME_MAX} characters",
                       "bad message: no consumer registered here for type 'no.such.type'",
                       "bad message: no type (neither the type property nor an x-event-type header)",
                       f"bad message: body of {MAX_BODY + 1} bytes is over the {MAX_BODY} byte limit"]


def test_ordered_retries_in_place_so_later_messages_of_the_key_wait(runtime, rabbit, behaviour):
    queue = rabbit.name("ordered")
    behaviour.fail_a = 1
    rabbit.channel.queue_declare(queue, durable=True, auto_delete=False,
                                 arguments={"x-single-active-consumer": True})
    rabbit.queues.append(queue)
    publish(rabbit, queue, 1, key="k")
    publish(rabbit, queue, 2, key="k")
    behaviour.fail_a = 1  # message 1's first attempt fails; 2's too, but only after 1 is done
    consumer, _ = consume(runtime, rabbit, queue, messages=2, ordered=True, prefetch=50)
    assert consumer.link.prefetch == 1
    a_rows = [r for r in rows(runtime) if r[0] == "a"]
    assert a_rows == [("a", 1, 2), ("a", 2, 2)]
    order = [(c[1], c[2]) for c in behaviour.calls if c[0] == "a"]
    assert order == [(1, 1), (1, 2), (2, 1), (2, 2)]  # 2 never ran before 1 was through
    assert not queue_exists(rabbit, f"{queue}.retry.500ms")  # no TTL queue in this mode


def test_ordered_refuses_a_queue_without_single_active_consumer(runtime, rabbit, queue, behaviour):
    with pytest.raises(SetupError, match="x-single-active-consumer"):
        consume(runtime, rabbit, queue, messages=1, ordered=True)


def test_a_missing_queue_is_a_setup_error_and_bind_declares_it(runtime, rabbit, behaviour):
    with pytest.raises(SetupError, match="does not exist"):
        consume(runtime, rabbit, rabbit.name("missing"), messages=1)
    exchange = rabbit.exchange()
    queue = rabbit.name("bound")
    rabbit.queues.append(queue)

    def publish_once_bound() -> None:
        # Once the consumer consumes from the queue it declared and bound (it binds before it consumes),
        # not a fixed second after the start, which a loaded machine could pass before the binding: the
        # message would have gone nowhere.
        wait_for(lambda: consumers_on(rabbit, queue) > 0, "the consumer to declare, bind and consume its queue")
        rabbit.connection.channel().basic_publish(
            amqp.Message(json.dumps({"n": 9}), message_id="bound-1", type="amqp.write"), exchange=exchange,
            routing_key="amqp.write")

    done = threading.Thread(target=publish_once_bound)
    done.start()
    consumer, _ = consume(runtime, rabbit, queue, messages=1, max_time=120, binds=[(exchange, "amqp.#")])
    done.join(60)
    assert rows(runtime) == [("a", 9, 1), ("b", 9, 1)]


def test_reconnects_after_the_connection_is_cut_or_closed_by_the_broker(runtime, rabbit, queue, behaviour):
    def handled() -> list[int]:
        return sorted(r[1] for r in rows(runtime) if r[0] == "a")

    with TcpProxy(5672) as proxy:
        consumer = QueueConsumer(runtime, parse_url(url(rabbit.vhost, proxy.port)), queue)
        budget = Budget(max_time=120, memory_mb=None)

        def faults():
            # Each fault once the consumer is where it must be for it (message 1 handled on its first
            # connection; connected again after the cut), not at fixed moments a loaded machine's slow
            # start could pass: a cut before the first connect, or a close before the reconnect, is no
            # fault at all. The run ends once all three are handled, not after 3 handled messages: a
            # message in hand at the cut comes again, and counts twice.
            try:
                wait_for(lambda: handled() == [1], "message 1 on the first connection")
                proxy.cut()
                wait_for(lambda: proxy.accepted >= 2, "the consumer to connect again after the cut")
                publish(rabbit, queue, 2)
                wait_for(lambda: rabbit.close_cronbox_connections("cronbox consumer"), "a consumer connection to close",
                         pause=0.2)
                publish(rabbit, queue, 3)  # handled on a third connection: the second is closed at the broker
                wait_for(lambda: handled() == [1, 2, 3], "the three messages handled")
            finally:
                budget.stop("signal")

        publish(rabbit, queue, 1)
        thread = threading.Thread(target=faults)
        thread.start()
        result = consumer.run(budget)
        thread.join(60)
    assert result.exit_code == 0 and consumer.stats.connects >= 3
    assert handled() == [1, 2, 3]


def test_heartbeats_are_serviced_while_idle(runtime, rabbit, queue, behaviour):
    """With a 2 s heartbeat the broker closes a connection that stays silent for about 4 s; the
    consumer idles 10 s on one connection and then handles a message on it. A window by nature (the
    idle time must be several heartbeats): 2 s rather than 1, so a loaded machine's pause between two
    of the consumer's polls does not reach the broker's limit."""
    threading.Timer(10.0, lambda: publish(rabbit, queue, 6)).start()
    consumer, _ = consume(runtime, rabbit, queue, messages=1, max_time=60, heartbeat_seconds=2)
    assert consumer.stats.connects == 1 and rows(runtime) == [("a", 6, 1), ("b", 6, 1)]


def test_an_unreachable_broker_ends_the_run_by_max_time_with_exit_1(runtime, behaviour):
    import socket

    hole = socket.create_server(("127.0.0.1", 0))
    port = hole.getsockname()[1]
    hole.close()
    consumer = QueueConsumer(runtime, parse_url(url("x", port)), "q")
    started = time.monotonic()
    result = consumer.run(Budget(max_time=2, memory_mb=None))
    assert result.exit_code == 1 and "broker unreachable" in result.error
    assert time.monotonic() - started < 30  # by its 2 s max time, not a retry loop that never ends
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Heartbeat).where(
            Heartbeat.outcome == "broker-unreachable")) == 1


def test_a_clean_stop_gives_back_what_was_read_ahead_without_the_redelivered_flag(runtime, rabbit, queue, behaviour,
                                                                                 caplog):
    """A cron-style run stops after one message with the rest prefetched (never started): they go back
    republished unchanged, not flagged redelivered, so the next run does not count them as deaths of a
    consumer. With --max-redeliveries 1 a single such count would park a message that never ran."""
    caplog.set_level("INFO", logger="cronbox")
    for n in range(1, 7):
        publish(rabbit, queue, n)
    consumer, result = consume(runtime, rabbit, queue, messages=1, max_redeliveries=1)
    assert result.exit_code == 0 and consumer.stats.done == 1
    given = [r.getMessage() for r in caplog.records if "read ahead and not started given back" in r.getMessage()]
    caplog.clear()
    consumer, result = consume(runtime, rabbit, queue, messages=5, max_redeliveries=1)
    assert result.exit_code == 0 and consumer.stats.parked == 0 and consumer.stats.done == 5
    assert not [r for r in caplog.records if "outcome=redelivered" in r.getMessage()
                or "outcome=parked" in r.getMessage()]
    assert sorted(rows(runtime)) == sorted((c, n, 1) for c in ("a", "b") for n in range(1, 7))
    assert rabbit.take(queue) == [] and rabbit.take(queues.dead_queue(queue)) == []
    assert given, "the first run stopped with nothing read ahead: the test proved nothing"
