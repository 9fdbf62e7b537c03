"""cronbox.forward declarations, CRONBOX_AMQP_URL parsing and the confirm bookkeeping of a batch
(the broker-facing behaviour is tested against the real RabbitMQ in tests/db/test_forward.py)."""
from __future__ import annotations

import pytest

import cronbox
from amqp.exceptions import ChannelError
from amqp import Message
from cronbox.outbox.core.errors import RegistrationError, SettingsError
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.amqp.broker import Batch, Broker, parse_url


def test_patterns_match_event_types_and_plain_consumers_stay_exact():
    registry = Registry()
    cronbox.forward("appointment.*", exchange="clinic", registry=registry)
    cronbox.forward(exchange="audit", name="everything", registry=registry)

    @cronbox.consumer("appointment.paid", name="exact", registry=registry)
    def exact(event, ctx):
        pass

    names = lambda t: [c.name for c in registry.consumers.for_type(t)]  # noqa: E731
    assert names("appointment.paid") == ["amqp:clinic:appointment.*", "everything", "exact"]
    assert names("appointment") == ["everything"]
    assert names("lab.result") == ["everything"]


def test_the_same_declaration_twice_is_fine_another_under_the_same_name_is_not():
    registry = Registry()
    cronbox.forward("a.*", exchange="x", name="feed", registry=registry)
    cronbox.forward("a.*", exchange="x", name="feed", registry=registry)  # a module imported again
    with pytest.raises(RegistrationError):
        cronbox.forward("a.*", exchange="y", name="feed", registry=registry)


@pytest.mark.parametrize("kwargs", [dict(exchange=None), dict(exchange="x", routing_key=5),
                                    dict(exchange="x", max_attempts=0), dict(exchange="x", timeout=0),
                                    dict(exchange="x", backoff="soon"), dict(exchange="x" * 200)])
def test_bad_declarations_are_refused_at_registration(kwargs):
    with pytest.raises(RegistrationError):
        cronbox.forward("a", registry=Registry(), **kwargs)


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
