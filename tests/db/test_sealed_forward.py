"""A sealed event type forwarded to RabbitMQ (issue 40), on every backend: published as its envelope with
the documented headers, which a foreign consumer holding the key folder opens from
docs/sealed-format.md alone; or, for a target that says `forward(..., open=True)`, published opened.
Either way the event's row stays sealed."""
from __future__ import annotations

import base64
import json
import secrets
import struct

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy import select, text

import cronbox
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.events.models import Delivery, OutboxEvent
from tests.helpers import relay
from tests.rabbit import amqp_vhost, rabbit  # noqa: F401  (the RabbitMQ fixtures)

MARKER = "PHI-MARKER biopsy results for Jane Roe"


def forward_sealed(runtime, registry, rabbit, *, open_: bool):
    """A sealed event type (a consumer elsewhere declares it), forwarded by a target; one event recorded
    and relayed. Returns (the message, the event's row)."""
    kind = f"clinic.result.{secrets.token_hex(3)}"
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, kind)
    cronbox.forward(kind, exchange=exchange, name=f"fwd-{kind}", open=open_, registry=registry)

    @consumer(kind, name=f"remote-{kind}", sealed=True, runs="broker", registry=registry)
    def remote(event, ctx):
        pass

    with runtime.sessions.begin() as session:
        cronbox.record(session, kind, {"text": MARKER}, key="patient:7")
    runtime.settings.raw["CRONBOX_AMQP_URL"] = rabbit.url
    relay(runtime)
    [message] = rabbit.take(queue)
    with runtime.sessions() as session:
        event = session.scalars(select(OutboxEvent)).one()
        assert session.scalars(select(Delivery.status)).all() == ["done"]
    assert event.payload.startswith("cbxp1:") and MARKER not in event.payload  # the row stays sealed
    return message, event


def body_of(message) -> str:
    return message.body if isinstance(message.body, str) else message.body.decode("utf-8")


def opened_as_the_spec_says(body: str, headers: dict, key_folder) -> dict:
    """A foreign consumer with a copy of the key folder, following docs/sealed-format.md ("Sealed payloads",
    "On a broker"): the key from the key file the envelope names, HKDF, the associated data rebuilt from the
    message's headers, AES-256-GCM."""
    prefix, key_id, encoded = body.split(":", 2)
    assert prefix == "cbxp1"
    master = base64.urlsafe_b64decode((key_folder / f"{key_id}.key").read_text().strip() + "=")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
               info=b"cronbox-payload/v1 key " + key_id.encode()).derive(master)
    install, seal_id = bytes.fromhex(headers["x-cronbox-install"]), bytes.fromhex(headers["x-cronbox-sealed"])
    name, table = headers["x-event-type"].encode(), b"cronbox_events"
    ad = (b"cronbox-payload/v1" + bytes([len(install)]) + install + bytes([len(table)]) + table + seal_id
          + bytes([len(key_id)]) + key_id.encode() + struct.pack(">H", len(name)) + name)
    raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    return json.loads(AESGCM(key).decrypt(raw[:12], raw[12:], ad))


def test_by_default_a_sealed_type_is_published_as_its_envelope_with_the_documented_headers(runtime, registry,
                                                                                          rabbit, settings):
    message, event = forward_sealed(runtime, registry, rabbit, open_=False)
    body = body_of(message)
    assert body == event.payload and MARKER not in body  # the broker never holds the text
    assert message.properties["content_type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):  # a foreign consumer that does not know sealing: a parse error
        json.loads(body)
    headers = message.properties["application_headers"]
    with runtime.sessions() as session:
        install_id = session.execute(text("SELECT install_id FROM cronbox_install WHERE id = 1")).scalar()
    assert headers["x-cronbox-sealed"] == event.seal_id and headers["x-cronbox-install"] == install_id
    assert headers["x-event-type"] == event.type and headers["x-event-id"] == event.id
    assert opened_as_the_spec_says(body, headers, settings.key_folder) == {"text": MARKER}


def test_a_target_that_says_open_publishes_the_sealed_type_opened(runtime, registry, rabbit):
    message, event = forward_sealed(runtime, registry, rabbit, open_=True)
    assert json.loads(body_of(message)) == {"text": MARKER}
    headers = message.properties["application_headers"]
    assert "x-cronbox-sealed" not in headers and "x-cronbox-install" not in headers
    assert headers["x-event-id"] == event.id and headers["x-event-key"] == "patient:7"
