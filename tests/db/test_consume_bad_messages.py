"""Whatever a publisher puts in a message, `amqp consume` parks it (or runs it) and goes on.

The messages are generated: every short-string property as arbitrary bytes (not valid UTF-8 most of
the time), header tables holding every AMQP field type (nested, huge, timestamps past any calendar),
missing or odd types, bodies that are not JSON. They are written as raw frames by the test (py-amqp
cannot even send most of them), each followed by a good message that must be consumed behind it."""
from __future__ import annotations

import secrets
import struct

import amqp
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cronbox.outbox.events import queues
from cronbox.outbox.amqp.broker import parse_url
from cronbox.outbox.events.parked import DeadQueue
from cronbox.outbox.amqp.unreadable import RAW_PROPERTIES
from tests.db.test_consume import behaviour, consume, publish, queue, rows  # noqa: F401  (fixtures)
from tests.rabbit import HOST, PORT

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

SHORTSTR_PROPS = ("content_type", "content_encoding", "correlation_id", "reply_to", "message_id", "type",
                  "app_id", "cluster_id")  # not expiration and user_id: the broker itself refuses odd ones
LAYOUT = (("content_type", "s"), ("content_encoding", "s"), ("application_headers", "F"), ("delivery_mode", "o"),
          ("priority", "o"), ("correlation_id", "s"), ("reply_to", "s"), ("expiration", "s"), ("message_id", "s"),
          ("timestamp", "L"), ("type", "s"), ("user_id", "s"), ("app_id", "s"), ("cluster_id", "s"))


# -- AMQP 0-9-1 field values written by hand (RabbitMQ's letters), so any of them can be sent ---------
def short(data: bytes) -> bytes:
    return bytes((len(data),)) + data


def field(kind: str, value) -> bytes:
    fixed = {"t": ">B", "b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q", "L": ">q",
             "f": ">f", "d": ">d", "T": ">Q"}
    if kind in fixed:
        return kind.encode() + struct.pack(fixed[kind], value)
    if kind in "Sx":
        return kind.encode() + struct.pack(">I", len(value)) + value
    if kind == "D":
        return b"D" + struct.pack(">Bi", *value)
    if kind == "V":
        return b"V"
    if kind == "F":
        return b"F" + table(value)
    if kind == "A":
        data = b"".join(field(k, v) for k, v in value)
        return b"A" + struct.pack(">I", len(data)) + data
    raise AssertionError(kind)


def table(items) -> bytes:
    data = b"".join(short(key) + field(kind, value) for key, (kind, value) in items)
    return struct.pack(">I", len(data)) + data


def property_bytes(props: dict) -> bytes:
    flags, out = 0, []
    for bit, (name, kind) in zip(range(15, 1, -1), LAYOUT):
        if name not in props:
            continue
        flags |= 1 << bit
        value = props[name]
        out.append(short(value) if kind == "s" else bytes((value,)) if kind == "o"
                   else struct.pack(">Q", value) if kind == "L" else table(value))
    return struct.pack(">H", flags) + b"".join(out)


def publish_frames(channel_id: int, chunk: int, routing_key: str, body: bytes, properties: bytes) -> bytes:
    """basic.publish to the default exchange: method, content header (with these exact property
    bytes) and body frames, the body cut into frames of at most `chunk` bytes (AMQP 0-9-1 4.2.3)."""
    def frame(kind: int, payload: bytes) -> bytes:
        return struct.pack(">BHI", kind, channel_id, len(payload)) + payload + b"\xce"

    method = struct.pack(">HHH", 60, 40, 0) + short(b"") + short(routing_key.encode()) + b"\x00"  # not mandatory
    header = struct.pack(">HHQ", 60, 0, len(body)) + properties
    return b"".join([frame(1, method), frame(2, header)]
                    + [frame(3, body[start:start + chunk]) for start in range(0, len(body), chunk)])


def publish_raw(rabbit, queue: str, body: bytes, props: dict) -> bool:
    """basic.publish of a message with these exact property bytes (frames written by the test), on a
    connection of its own; False if the broker refused it (it closed the connection: such a message
    never reaches a consumer)."""
    connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=rabbit.vhost, connect_timeout=5)
    connection.connect()
    try:
        channel = connection.channel()
        connection.transport.write(publish_frames(channel.channel_id, connection.frame_max - 8, queue, body,
                                                  property_bytes(props)))
        channel.basic_qos(0, 0, False)  # a round trip: the broker took the publish (or closed on it)
        return True
    except (amqp.exceptions.AMQPError, OSError):
        return False
    finally:
        try:
            connection.close()
        except Exception:
            connection.collect()


scalar = st.one_of(
    st.tuples(st.just("t"), st.integers(0, 255)), st.tuples(st.just("b"), st.integers(-128, 127)),
    st.tuples(st.just("B"), st.integers(0, 255)), st.tuples(st.just("s"), st.integers(-2**15, 2**15 - 1)),
    st.tuples(st.just("u"), st.integers(0, 2**16 - 1)), st.tuples(st.just("I"), st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just("i"), st.integers(0, 2**32 - 1)), st.tuples(st.just("l"), st.integers(-2**63, 2**63 - 1)),
    st.tuples(st.just("L"), st.integers(-2**63, 2**63 - 1)), st.tuples(st.just("f"), st.floats(width=32)),
    st.tuples(st.just("d"), st.floats()), st.tuples(st.just("T"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("S"), st.binary(max_size=300)), st.tuples(st.just("x"), st.binary(max_size=300)),
    st.tuples(st.just("D"), st.tuples(st.integers(0, 255), st.integers(-2**31, 2**31 - 1))),
    st.tuples(st.just("V"), st.none()))
values = st.recursive(scalar, lambda inner: st.one_of(
    st.tuples(st.just("F"), st.lists(st.tuples(st.binary(max_size=20), inner), max_size=4)),
    st.tuples(st.just("A"), st.lists(inner, max_size=4))), max_leaves=12)
headers = st.lists(st.tuples(st.one_of(st.binary(max_size=30), st.sampled_from(
    [b"x-event-type", b"x-event-key", b"x-trace-id", b"x-created-at", b"x-event-id", b"x-cronbox-attempts",
     b"x-cronbox-redeliveries"])), values), max_size=6)
messages = st.fixed_dictionaries({}, optional={
    **{name: st.one_of(st.binary(max_size=255), st.sampled_from([b"amqp.write", b"application/json", b""]))
       for name in SHORTSTR_PROPS},
    "application_headers": headers, "delivery_mode": st.integers(1, 2), "priority": st.integers(0, 255),
    "timestamp": st.integers(0, 2**64 - 1)})
bodies = st.one_of(st.binary(max_size=2000), st.just(b'{"n": 1}'), st.just(b"[1, 2"), st.just(b"\xff\xfe{}"))


def bad_batch(props: dict) -> dict:
    """Never a message a consumer here would run: a message_id nobody registered for's type."""
    props = dict(props)
    if props.get("type") == b"amqp.write":
        props["type"] = b"amqp.nobody"
    props["application_headers"] = [(k, v) for k, v in props.get("application_headers", [])
                                    if k != b"x-event-type"]
    return props


def parked(rabbit, queue) -> list[amqp.Message]:
    return rabbit.take(queues.dead_queue(queue))


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(st.tuples(messages, bodies), min_size=1, max_size=12))
def test_any_message_a_publisher_sends_is_parked_with_a_reason_and_the_queue_goes_on(runtime, rabbit, queue,
                                                                                     behaviour, batch):
    sent = 0
    for n, (props, body) in enumerate(batch):
        sent += publish_raw(rabbit, queue, body, bad_batch(props))
        publish(rabbit, queue, 1000 + n)
    before = len(rows(runtime))
    consumer, result = consume(runtime, rabbit, queue, messages=sent + len(batch))
    assert result.exit_code == 0, result.error
    assert len(rows(runtime)) - before == 2 * len(batch)  # each good message: consumers a and b
    dead = parked(rabbit, queue)
    assert len(dead) == sent and consumer.stats.bad == sent
    assert all(m.properties["application_headers"][queues.REASON].startswith("bad message: ") for m in dead)
    assert rabbit.take(queue) == []


@pytest.mark.parametrize("prop", ["message_id", "type", "content_type", "correlation_id", "app_id"])
def test_a_property_that_is_not_utf8_is_parked_as_it_came_and_a_good_message_behind_it_runs(
        runtime, rabbit, queue, behaviour, prop):
    props = {"message_id": b"m-1", "type": b"amqp.write", prop: b"bad\xff\xfe id"}
    assert publish_raw(rabbit, queue, b'{"n": 1}', props)
    publish(rabbit, queue, 2)
    consumer, result = consume(runtime, rabbit, queue, messages=2)
    assert result.exit_code == 0 and consumer.stats.bad == 1
    assert sorted(rows(runtime)) == [("a", 2, 1), ("b", 2, 1)]
    with DeadQueue(parse_url(rabbit.url), queue) as dq:
        listed, total = dq.list(10)
    assert total == 1 and listed[0].reason.startswith("bad message: its properties cannot be read (UnicodeDecodeError")
    (copy,) = parked(rabbit, queue)
    assert copy.body == b'{"n": 1}'
    assert copy.properties["application_headers"][RAW_PROPERTIES] == property_bytes(props)


def test_a_header_timestamp_past_any_calendar_and_an_unknown_field_type_are_parked(runtime, rabbit, queue, behaviour):
    assert publish_raw(rabbit, queue, b'{"n": 1}', {"message_id": b"m-t", "type": b"amqp.write",
                                             "application_headers": [(b"when", ("T", 2**64 - 1))]})
    assert publish_raw(rabbit, queue, b"", {"message_id": b"\xc3", "type": b"\xff"})  # no body at all
    publish(rabbit, queue, 3)
    consumer, result = consume(runtime, rabbit, queue, messages=3)
    assert result.exit_code == 0 and consumer.stats.bad == 2
    assert sorted(rows(runtime)) == [("a", 3, 1), ("b", 3, 1)]
    assert len(parked(rabbit, queue)) == 2


def test_a_big_unreadable_message_over_many_frames_is_parked_whole(runtime, rabbit, queue, behaviour):
    body = secrets.token_bytes(400_000)  # several body frames after the header py-amqp refuses
    assert publish_raw(rabbit, queue, body, {"message_id": b"\xff" * 255, "type": b"amqp.write"})
    publish(rabbit, queue, 4)
    consumer, result = consume(runtime, rabbit, queue, messages=2, prefetch=5)
    assert result.exit_code == 0 and consumer.stats.bad == 1
    assert sorted(rows(runtime)) == [("a", 4, 1), ("b", 4, 1)]
    (copy,) = parked(rabbit, queue)
    assert copy.body == body


def test_an_unreadable_message_in_ordered_mode_is_parked_too(runtime, rabbit, behaviour):
    name = rabbit.name("ord")
    rabbit.channel.queue_declare(name, durable=True, auto_delete=False, arguments={"x-single-active-consumer": True})
    rabbit.queues.append(name)
    assert publish_raw(rabbit, name, b"{}", {"message_id": b"\x80", "type": b"amqp.write"})
    publish(rabbit, name, 5, key="k")
    consumer, result = consume(runtime, rabbit, name, messages=2, ordered=True)
    assert result.exit_code == 0 and consumer.stats.bad == 1
    assert sorted(rows(runtime)) == [("a", 5, 1), ("b", 5, 1)]
    assert len(parked(rabbit, name)) == 1
