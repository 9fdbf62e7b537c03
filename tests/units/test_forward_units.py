"""outbox.forward declarations, CRONBOX_AMQP_URL parsing and the confirm bookkeeping of a batch
(the broker-facing behaviour is tested against the real RabbitMQ in tests/db/test_forward.py)."""
from __future__ import annotations

import pytest

import outbox
from amqp.exceptions import ChannelError
from amqp import Message
from outbox.core.errors import RegistrationError, SettingsError
from outbox.engine.registry import Registry
from outbox.events.broker import Batch, Broker, parse_url


def test_patterns_match_event_types_and_plain_consumers_stay_exact():
    registry = Registry()
    outbox.forward("appointment.*", exchange="clinic", registry=registry)
    outbox.forward(exchange="audit", name="everything", registry=registry)

    @outbox.consumer("appointment.paid", name="exact", registry=registry)
    def exact(event, ctx):
        pass

    names = lambda t: [c.name for c in registry.consumers.for_type(t)]  # noqa: E731
    assert names("appointment.paid") == ["amqp:clinic:appointment.*", "everything", "exact"]
    assert names("appointment") == ["everything"]
    assert names("lab.result") == ["everything"]


def test_the_same_declaration_twice_is_fine_another_under_the_same_name_is_not():
    registry = Registry()
    outbox.forward("a.*", exchange="x", name="feed", registry=registry)
    outbox.forward("a.*", exchange="x", name="feed", registry=registry)  # a module imported again
    with pytest.raises(RegistrationError):
        outbox.forward("a.*", exchange="y", name="feed", registry=registry)


@pytest.mark.parametrize("kwargs", [dict(exchange=None), dict(exchange="x", routing_key=5),
                                    dict(exchange="x", max_attempts=0), dict(exchange="x", timeout=0),
                                    dict(exchange="x", backoff="soon"), dict(exchange="x" * 200)])
def test_bad_declarations_are_refused_at_registration(kwargs):
    with pytest.raises(RegistrationError):
        outbox.forward("a", registry=Registry(), **kwargs)


def test_urls():
    a = parse_url("amqp://user:p%40ss@broker.example:5673/clinic%2Fprod")
    assert (a.host, a.port, a.user, a.password, a.vhost, a.tls) == ("broker.example", 5673, "user", "p@ss",
                                                                    "clinic/prod", False)
    assert "p@ss" not in repr(a) and "pss" not in repr(a)
    b = parse_url("amqps://broker.example?cafile=/etc/ca.pem")
    assert (b.port, b.vhost, b.tls, b.ca_file, b.user) == (5671, "/", True, "/etc/ca.pem", "guest")
    for bad in ("http://broker", "amqp://", "amqp://host:notaport/"):
        with pytest.raises(SettingsError):
            parse_url(bad)


def test_a_bad_url_fails_each_batch_visibly_instead_of_the_tick():
    assert Broker("redis://x").send([object()], 1)[0].startswith("CRONBOX_AMQP_URL must look like")


def test_batch_confirms_single_multiple_nack_and_return_before_ack():
    batch = Batch(4)
    batch.by_tag = {11: 0, 12: 1, 13: 2, 14: 3}
    returned = Message(b"{}", message_id="m2")
    batch.on_return(ChannelError("NO_ROUTE", reply_code=312), "x", "rk", returned)
    batch.on_ack(13, True)  # 11..13 at once
    batch.on_ack(14, False, nacked=True)
    out = batch.finish(["m0", "m1", "m2", "m3"], "unconfirmed")
    assert out[0] is None and out[1] is None
    assert out[2].startswith("unroutable") and "312" in out[2]
    assert "nack" in out[3]
    late = Batch(2)
    late.by_tag = {1: 0, 2: 1}
    late.on_ack(1, False)
    assert late.finish(["a", "b"], "no confirm") == [None, "no confirm"]


def _py_amqp_frames(channel_id: int, frame_max: int, message) -> bytes:
    """What py-amqp's own channel.basic_publish(mandatory=True) writes for `message`."""
    from types import SimpleNamespace

    from amqp import spec
    from amqp.method_framing import frame_writer
    from amqp.serialization import dumps

    written = []
    transport = SimpleNamespace(write=lambda data: written.append(bytes(data)))
    write = frame_writer(SimpleNamespace(frame_max=frame_max, bytes_sent=0), transport)
    args = dumps("Bssbb", (0, message.exchange, message.routing_key, True, False))
    write(1, channel_id, spec.Basic.Publish, args, Message(message.body, **message.properties))
    return b"".join(written)


@pytest.mark.parametrize("body_size", [0, 40, 4096, 300_000])
@pytest.mark.parametrize("key", [None, "patient:ünï", "k" * 300])
def test_publish_frames_are_the_bytes_py_amqp_writes(body_size, key):
    from datetime import datetime

    from outbox.events.broker import Outgoing, publish_frames
    from outbox.events.deliveries import Claimed
    from outbox.events.forward import message_of, message_properties

    created = datetime(2026, 12, 1, 9, 30, 15, 123456)
    body = "{" + "7" * body_size + "}"
    for event_id in (7, 2_147_483_647, 2_147_483_648, 10**15, -5):
        for event_type in ("appointment.päid", "t" * 255, "t" * 256):  # the last: too long for a short string
            item = Claimed(1, "c", 1, "tok", created, event_id, event_type, key, body, "0123456789abcdef", created)
            message = Outgoing("clinic.ëx", "appointment.päid", body.encode(), message_properties(item))
            encoded = message_of("clinic.ëx", "appointment.päid", item)  # what the relay publishes
            assert encoded.properties["message_id"] == message.properties["message_id"]
            assert (encoded.header is None) == (len(event_type) > 255)
            for frame_max in (4096, 131072):
                if len(event_type) > 255:  # py-amqp refuses it as well
                    continue
                expected = _py_amqp_frames(3, frame_max, message)
                assert publish_frames(3, frame_max - 8, message) == expected
                assert publish_frames(3, frame_max - 8, encoded) == expected
    odd = Outgoing("x", "rk", b"{}", {"message_id": "m", "application_headers": {"f": 1.5, "t": True, "n": None}})
    assert publish_frames(1, 131072 - 8, odd) == _py_amqp_frames(1, 131072, odd)  # py-amqp's serializer
