"""Public-API floors with RabbitMQ: py-amqp's `basic_publish` on a confirm channel, the batch's
confirms collected through the channel's basic_ack events (`drain_events`), and `basic_consume` with
a per-message write and `basic_ack`. No cronbox imported.

    python bench/floor_amqp.py KIND DB_URL N      (FLOOR_AMQP_URL, FLOOR_EXCHANGE, FLOOR_QUEUE in the env)

KIND: publish (the bare publisher: N messages as the tick makes them, in batches of the tick's 100,
each batch's confirms awaited before the next), forward (floor_sql's claim-and-fan-out of 100 events,
published as above, their deliveries acked in one UPDATE), fill (N messages for `consume`), consume
(prefetch as `amqp consume`'s default, per message: its row INSERT + COMMIT, then basic_ack).
Jobs on RabbitMQ (issue 28; FLOOR_JOBS_QUEUE in the env): jobs-publish (the tick's job publisher by
hand: claim 500, publish their job messages, confirms awaited, extend their lease), jobs-bare (the same
N messages, batches of 500, no database), jobs-work (the broker worker by hand: take the row by id and
token, the one row and the ack UPDATE in one transaction, basic_ack).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from datetime import timezone
from types import SimpleNamespace
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


def declare_queue(url: str, queue: str) -> None:
    """A durable queue on the default exchange (as the job publisher declares its queue)."""
    with connect(url) as connection:
        connection.channel().queue_declare(queue, durable=True, auto_delete=False)


def count(url: str, queue: str) -> int:
    with connect(url) as connection:
        return connection.channel().queue_declare(queue, passive=True).message_count


def purge(url: str, queue: str) -> int:
    with connect(url) as connection:
        return connection.channel().queue_purge(queue)


def delete_queue(url: str, queue: str) -> None:
    with connect(url) as connection:
        connection.channel().queue_delete(queue)


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


# ---- jobs on RabbitMQ (issue 28) ---------------------------------------------------------------
def job_message(queue: str, row) -> tuple:
    """What outbox.queue.job_messages.message_for makes of a claimed job: (routing key, body, properties)."""
    token, trace_id = floor_sql.text_of(row.claim_token), floor_sql.text_of(row.trace_id)
    body = json.dumps({"job": row.id, "claim_token": token}, separators=(",", ":")).encode()
    return (queue, body, {
        "content_type": "application/json", "delivery_mode": 2,
        "message_id": f"cronbox-job-{row.id}-{hashlib.sha256(token.encode()).hexdigest()[:16]}",
        "correlation_id": trace_id, "type": "cronbox.job", "app_id": "cronbox",
        "application_headers": {"x-cronbox-queue": floor_sql.text_of(row.queue),
                                "x-cronbox-handler": floor_sql.text_of(row.handler), "x-trace-id": trace_id}})


def job_publisher() -> tuple[ConfirmedPublisher, str]:
    """The publisher's connection: the job queue declared durable (as Broker.declare_queue), then
    basic_publish to the default exchange, routed by the queue's name."""
    queue = os.environ["FLOOR_JOBS_QUEUE"]
    publisher = ConfirmedPublisher(os.environ["FLOOR_AMQP_URL"], "")
    publisher.channel.queue_declare(queue, durable=True, auto_delete=False)
    return publisher, queue


def jobs_publish(engine) -> int:
    """The tick's job publisher by hand, on one connection as the tick's: per batch of 500 one
    transaction claims (floor_sql.claim_to_publish), the messages go out with their confirms awaited,
    then one transaction extends the confirmed rows' lease (floor_sql.published); until a claim finds
    nothing."""
    jobs = floor_sql.tables(engine).tables["cronbox_jobs"]
    publisher, queue = job_publisher()
    done = 0
    with engine.connect() as c:
        while True:
            with c.begin():
                rows = floor_sql.claim_to_publish(engine, c, jobs, floor_sql.utcnow())
            if not rows:
                break
            publisher.send([job_message(queue, row) for row in rows])
            with c.begin():
                assert floor_sql.published(c, jobs, rows, floor_sql.utcnow() + floor_sql.REPUBLISH_AFTER) == len(rows)
            done += len(rows)
    publisher.close()
    return done


def jobs_bare(n: int) -> None:
    """The bare publisher: n job messages as the publisher makes them, batches of 500, no database."""
    publisher, queue = job_publisher()
    messages = [job_message(queue, SimpleNamespace(
        id=i, claim_token="%032x" % (i // floor_sql.PUBLISH_BATCH), trace_id="%032x" % i, queue=floor_sql.JOBS_QUEUE,
        handler=floor_sql.JOB_WRITE)) for i in range(1, n + 1)]
    for start in range(0, n, floor_sql.PUBLISH_BATCH):
        publisher.send(messages[start:start + floor_sql.PUBLISH_BATCH])
    publisher.close()


def jobs_work(engine, n: int) -> None:
    """The bare broker worker: basic_consume with prefetch 10 (`amqp work`'s default) on one database
    connection; per message its body parsed, the job taken by id and token (floor_sql.job_take: the row
    read, then the UPDATE by its pair, its own transaction), basic_ack (one per message), its payload parsed, then one
    transaction: the one row INSERT in a savepoint (ctx.session's), the token-guarded ack UPDATE, COMMIT."""
    jobs = floor_sql.tables(engine).tables["cronbox_jobs"]
    ack = floor_sql.job_ack(jobs)
    connection = connect(os.environ["FLOOR_AMQP_URL"])
    channel = connection.channel()
    channel.basic_qos(0, PREFETCH, False)
    done = 0
    with engine.connect() as c:
        def on_message(message):
            nonlocal done
            named = json.loads(message.body)
            with c.begin():
                token, [row] = floor_sql.job_take(c, jobs, [(named["job"], named["claim_token"])], floor_sql.utcnow())
            channel.basic_ack(message.delivery_tag)  # taken: from here the row is the job's state
            payload = json.loads(row.payload)
            token = floor_sql.ident(jobs, "claim_token", token)
            with c.begin():
                with c.begin_nested():
                    c.execute(floor_sql.ROW_INSERT, {"event_id": payload["i"]})
                assert c.execute(ack, {"ids": [row.id], "token": token, "now": floor_sql.utcnow()}).rowcount == 1
            done += 1

        channel.basic_consume(os.environ["FLOOR_JOBS_QUEUE"], callback=on_message)
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
    elif kind == "jobs-publish":
        assert jobs_publish(floor_sql.engine_for(url)) == n
    elif kind == "jobs-bare":
        jobs_bare(n)
    elif kind == "jobs-work":
        jobs_work(floor_sql.engine_for(url), n)
    else:
        raise SystemExit(f"unknown kind {kind}")
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu": floor_sql.cpu_seconds() - cpu}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
