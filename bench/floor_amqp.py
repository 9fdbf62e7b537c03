"""Public-API floors with RabbitMQ: py-amqp's `basic_publish` on a confirm channel, the batch's
confirms collected through the channel's basic_ack events (`drain_events`), and `basic_consume` with
a per-message write and `basic_ack`. No cronbox imported.

    python bench/floor_amqp.py KIND DB_URL N      (FLOOR_AMQP_URL, FLOOR_EXCHANGE, FLOOR_QUEUE in the env)

KIND: publish (the bare publisher: N messages as the tick makes them, in batches of the tick's 100,
each batch's confirms awaited before the next), forward (floor_sql's claim-and-fan-out of 100 events,
published as above, their deliveries acked in one UPDATE), fill (N messages for `consume`), consume
(prefetch as `amqp consume`'s default, per message: its row INSERT + COMMIT, then basic_ack).
"""
from __future__ import annotations

import json
import os
import sys
import time
from datetime import timezone
from urllib.parse import unquote, urlsplit

import amqp

import floor_sql

PREFETCH = 10  # `amqp consume --prefetch` default


def connect(url: str) -> amqp.Connection:
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    connection = amqp.Connection(f"{parts.hostname}:{parts.port or 5672}", userid=unquote(parts.username or "guest"),
                                 password=unquote(parts.password or "guest"), virtual_host=vhost)
    connection.connect()
    return connection


def declare(url: str, exchange: str, queue: str) -> None:
    """The run's durable exchange and queue (bound with '#'), so the broker writes persistent messages."""
    with connect(url) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic", durable=True, auto_delete=False)
        channel.queue_declare(queue, durable=True, auto_delete=False)
        channel.queue_bind(queue, exchange, "#")


def purge(url: str, queue: str) -> int:
    with connect(url) as connection:
        return connection.channel().queue_purge(queue)


def delete(url: str, exchange: str, queue: str) -> None:
    with connect(url) as connection:
        channel = connection.channel()
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)


def properties(event_id: int, event_type: str, trace_id: str, created) -> dict:
    """The properties cronbox's forward gives a keyless event's message (outbox/events/forward.py)."""
    created = created.replace(tzinfo=timezone.utc)
    return {"content_type": "application/json", "content_encoding": "utf-8", "delivery_mode": 2,
            "message_id": f"cronbox-{event_id}-{trace_id}", "correlation_id": trace_id, "type": event_type,
            "timestamp": int(created.timestamp()), "app_id": "cronbox",
            "application_headers": {"x-event-type": event_type, "x-event-id": event_id, "x-trace-id": trace_id,
                                    "x-created-at": created.isoformat(timespec="microseconds")}}


class ConfirmedPublisher:
    """basic_publish on a confirm channel; `send` returns once the broker confirmed the whole batch."""

    def __init__(self, url: str, exchange: str):
        self.connection = connect(url)
        self.channel = self.connection.channel()
        self.channel.confirm_select()
        self.exchange, self.confirmed, self.sent = exchange, 0, 0
        self.channel.events["basic_ack"].add(self.on_ack)
        self.channel.events["basic_nack"].add(self.on_nack)

    def on_ack(self, tag, multiple):
        self.confirmed = tag if multiple else self.confirmed + 1  # tags are 1..sent, in order on one channel

    def on_nack(self, tag, multiple):
        raise RuntimeError(f"broker nacked {tag}")

    def send(self, messages) -> None:
        for routing_key, body, props in messages:
            self.channel.basic_publish(amqp.Message(body, **props), self.exchange, routing_key, mandatory=True)
        self.sent += len(messages)
        while self.confirmed < self.sent:
            self.connection.drain_events(timeout=30)

    def close(self) -> None:
        self.connection.close()


def publish(n: int, event_type: str) -> None:
    publisher = ConfirmedPublisher(os.environ["FLOOR_AMQP_URL"], os.environ["FLOOR_EXCHANGE"])
    now = floor_sql.utcnow()
    messages = [(event_type, json.dumps({"i": i}).encode(), properties(i, event_type, "%032x" % i, now))
                for i in range(1, n + 1)]
    for start in range(0, n, floor_sql.BATCH):
        publisher.send(messages[start:start + floor_sql.BATCH])
    publisher.close()


def forward(engine) -> int:
    publisher = ConfirmedPublisher(os.environ["FLOOR_AMQP_URL"], os.environ["FLOOR_EXCHANGE"])

    def handle_batch(t, token, rows):
        publisher.send([(floor_sql.text_of(r.type), floor_sql.text_of(r.payload).encode(),
                         properties(r.id, floor_sql.text_of(r.type), floor_sql.text_of(r.trace_id), r.created_at)) for r in rows])
        with engine.begin() as c:
            floor_sql.ack_deliveries(c, t, token, [r.id for r in rows])

    done = floor_sql.relay(engine, "fl.amqp", handle_batch)
    publisher.close()
    return done


def consume(engine, n: int) -> None:
    connection = connect(os.environ["FLOOR_AMQP_URL"])
    channel = connection.channel()
    channel.basic_qos(0, PREFETCH, False)
    done = 0

    def on_message(message):
        nonlocal done
        payload = json.loads(message.body)
        with engine.begin() as c:
            c.execute(floor_sql.ROW_INSERT, {"event_id": payload["i"]})
        channel.basic_ack(message.delivery_tag)
        done += 1

    channel.basic_consume(os.environ["FLOOR_QUEUE"], callback=on_message)
    while done < n:
        connection.drain_events(timeout=30)
    connection.close()


def main(kind: str, url: str, n: int) -> None:
    started, cpu = time.perf_counter(), floor_sql.cpu_seconds()
    if kind == "publish":
        publish(n, "fl.fwd")
    elif kind == "fill":
        publish(n, "fl.cwrite")
    elif kind == "forward":
        assert forward(floor_sql.engine_for(url)) == n
    elif kind == "consume":
        consume(floor_sql.engine_for(url), n)
    else:
        raise SystemExit(f"unknown kind {kind}")
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu": floor_sql.cpu_seconds() - cpu}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
