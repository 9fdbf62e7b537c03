"""Forwarding benchmark: the relay publishing to RabbitMQ with confirms, against a bare publisher
and cronbox's own no-op relay, in one run.

    .venv/bin/python -m bench.bench_amqp [--mysql mysql+pymysql://root:@127.0.0.1/test] [--events 5000]
                                         [--amqp amqp://guest:guest@127.0.0.1:5672/]

- bare publisher: the same client (py-amqp), the same persistent messages with the same properties,
  publisher confirms and mandatory, batches of the same size (500), no database;
- relay → RabbitMQ: events recorded beforehand, one relay run forwarding them (claim, publish the
  batch, collect its confirms, ack the confirmed);
- no-op relay: the same events relayed to an in-process consumer that does nothing.
- consumer with the inbox (`amqp consume`'s QueueConsumer, one consumer writing one row) against a
  bare consumer: the same py-amqp client and prefetch, the same row INSERT + COMMIT + basic.ack per
  message on one held connection, no inbox, no handler machinery (`--part consume` runs only these,
  into the "Consuming from RabbitMQ" section).
The exchange and queue (durable, so the broker writes the persistent messages to disk) are made
for the run and deleted after it. Prints a table and rewrites the "Forwarding to RabbitMQ" section
of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from collections import deque
from datetime import datetime, timezone

import amqp

from sqlalchemy import text

import outbox
from bench import handlers
from bench.bench_outbox import Target, bulk_record, relay_rate
from bench.report import write_section
from outbox.engine.budget import Budget
from outbox.events.broker import Broker, Outgoing
from outbox.events.consume import QueueConsumer
from outbox.events.deliveries import Claimed
from outbox.events.forward import message_properties
from outbox.events.record import new_trace_id
from outbox.events.relay import Relay

BATCH = 500
PAYLOAD = {"i": 0, "appointment": 123456, "status": "paid", "amount_cents": 4500}


class TimedBroker(Broker):
    """The relay's broker, adding up the time spent publishing and waiting for confirms (the
    database work the relay does while confirms are in flight is not counted)."""

    seconds = 0.0

    def publish(self, messages, timeout):
        started = time.perf_counter()
        try:
            return super().publish(messages, timeout)
        finally:
            self.seconds += time.perf_counter() - started

    def collect(self, flight):
        started = time.perf_counter()
        try:
            return super().collect(flight)
        finally:
            self.seconds += time.perf_counter() - started


class Broker_:
    """The run's exchange and queue on the benchmark's broker."""

    def __init__(self, url: str):
        self.url = url
        address = Broker(url).address
        self.connection = amqp.Connection(f"{address.host}:{address.port}", userid=address.user,
                                          password=address.password, virtual_host=address.vhost)
        self.connection.connect()
        self.channel = self.connection.channel()
        self.exchange = f"cronbox-bench-{secrets.token_hex(4)}"
        self.queue = self.exchange + ".q"
        self.channel.exchange_declare(self.exchange, "topic", durable=True, auto_delete=False)
        self.channel.queue_declare(self.queue, durable=True, auto_delete=False)
        self.channel.queue_bind(self.queue, self.exchange, "#")

    def purge(self) -> int:
        return self.channel.queue_purge(self.queue)

    def close(self) -> None:
        self.channel.queue_delete(self.queue)
        self.channel.exchange_delete(self.exchange)
        self.connection.close()


def bare_publisher(broker: Broker_, n: int) -> float:
    """Messages/s: the client alone, batches of BATCH published then their confirms collected."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    items = [Claimed(i, "bench", 1, "t", now, i, "bench.fwd", None, outbox.core.payload.dump_payload({**PAYLOAD, "i": i}),
                     new_trace_id(), now) for i in range(1, n + 1)]
    messages = [Outgoing(broker.exchange, "bench.fwd", item.payload.encode(), message_properties(item))
                for item in items]
    client = Broker(broker.url)
    started = time.perf_counter()
    for start in range(0, n, BATCH):
        results = client.send(messages[start:start + BATCH], 30)
        assert not any(results), results[:3]
    took = time.perf_counter() - started
    client.close()
    assert broker.purge() == n
    return n / took


def forward_rate(t: Target, broker: Broker_, n: int) -> tuple[float, float]:
    """Deliveries/s, and the share of the run spent in the broker client (publish + confirms)."""
    for start in range(0, n, 500):
        with t.runtime.sessions.begin() as s:
            for i in range(start, min(n, start + 500)):
                outbox.record(s, "bench.fwd", {**PAYLOAD, "i": i})
    client = TimedBroker(broker.url)
    relay = Relay(t.runtime, batch_size=BATCH, broker=client)
    started = time.perf_counter()
    relay.run(Budget(max_time=600, memory_mb=None))
    took = time.perf_counter() - started
    relay.close()
    assert relay.stats.done == n, relay.stats
    assert broker.purge() == n
    return n / took, client.seconds / took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql", default=os.environ.get("TEST_MYSQL_URL"))
    parser.add_argument("--amqp", default=os.environ.get("CRONBOX_AMQP_URL") or "amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--part", choices=["all", "forward", "consume"], default="all")
    parser.add_argument("--messages", type=int, default=3000, help="messages per consumer run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each part (best of them)")
    args = parser.parse_args()
    if args.part in ("all", "consume"):
        consume_main(args)
    if args.part == "consume":
        return
    broker = Broker_(args.amqp)
    outbox.forward("bench.fwd", exchange=broker.exchange, name="bench.amqp")
    results = {}
    try:
        for label, url in [("SQLite", None)] + ([("MariaDB", args.mysql)] if args.mysql else []):
            t = Target(label, url)
            try:
                # The three runs interleaved, best of --rounds each: other work on the machine slows
                # single runs by up to half; the best round of each is the least disturbed.
                r = {"bare": 0.0, "forward": 0.0, "noop": 0.0, "in_client": 0.0}
                for _ in range(args.rounds):
                    r["bare"] = max(r["bare"], bare_publisher(broker, args.events))
                    rate, in_client = forward_rate(t, broker, args.events)
                    if rate > r["forward"]:
                        r["forward"], r["in_client"] = rate, in_client
                    t.reset()
                    r["noop"] = max(r["noop"], relay_rate(t, "bench.noop", args.events))
                    t.reset()
                r["vs_bare"] = r["forward"] / r["bare"]
                r["vs_noop"] = r["forward"] / r["noop"]
                results[label] = r
                print(label, {k: round(v, 3) for k, v in r.items()}, flush=True)
            finally:
                t.close()
    finally:
        broker.close()
    rows = [
        (f"bare publisher, the relay's client (broker.Broker), persistent + confirms, batches of {BATCH} (messages/s)", "bare", "{:,.0f}"),
        (f"relay → RabbitMQ with confirms, {args.events:,} events (deliveries/s)", "forward", "{:,.0f}"),
        ("relay to a no-op consumer, same events (deliveries/s)", "noop", "{:,.0f}"),
        ("share of that relay run inside the broker client (publishing, reading confirms not yet in)", "in_client",
         "{:.0%}"),
        ("relay → RabbitMQ / bare publisher (target ≥ 60 %)", "vs_bare", "{:.0%}"),
        ("relay → RabbitMQ / no-op relay (target ≥ 70 %)", "vs_noop", "{:.0%}"),
    ]
    table = markdown_table(results, rows)
    print(table)
    command = "python -m bench.bench_amqp" + (" --mysql mysql+pymysql://root:@127.0.0.1/test" if args.mysql else "")
    command += f" (best of {args.rounds} interleaved rounds)"
    write_section("amqp", "Forwarding to RabbitMQ", command, table + NOTES)


NOTES = """
How the relay forwards (issue 11 follow-up): batches are pipelined one deep. Batch N is published;
while its confirms come in, the relay acks N-1 (one UPDATE per batch), fans out and claims N+1; N's
confirms are read just before N+1 is published. Nothing is acked before its confirm; the claim of
N+1 cannot take a later delivery of a key N carries (N's deliveries are pending, so they hold their
keys). The publish frames are written by cronbox (`broker.publish_frames`, byte for byte py-amqp's),
not by `basic_publish`, which did a non-blocking read before every message, serialized properties
generically and wrote each message separately. The bare publisher uses the same client, so it got
faster too.

Before and after, same machine, A/B/A/B, best of 3 interleaved rounds each (`python -m
bench.bench_amqp --mysql ...`, before = main at 8f909b6 with this bench script; the machine's load
average was 8-14 from other work throughout):

| run | SQLite relay/s | vs bare | vs no-op | MariaDB relay/s | vs bare | vs no-op |
|---|---|---|---|---|---|---|
| before 1 | 1,137 | 58% | 88% | 532 | 34% | 90% |
| after 1 | 1,124 | 33% | 119% | 1,600 | 35% | 149% |
| before 2 | 1,561 | 66% | 98% | 761 | 33% | 80% |
| after 2 | 1,551 | 49% | 75% | 1,399 | 33% | 92% |

The bare publisher went from 1,971-2,358 to 3,156-4,527 messages/s in the same runs. The earlier
single-run figures in this section were 54 % / 42 % of the bare publisher and 66 % / 80 % of the
no-op relay.

Where the time goes now (SQLite, 5,000 events, one run at load ~7, timers around each step: bare
publisher 6,050/s, relay 3,405/s, no-op relay 4,297/s): the relay spent 0.45 s fanning out, 0.46 s
claiming, 0.28 s acking (ten statements of 500), 0.16 s writing frames, 0.1 s building messages, and
0.01 s waiting for confirms (1.1 s before the pipeline: the whole confirm wait is now hidden). The
bare publisher spent 0.09 s writing and 0.73 s waiting: it is bound by the broker persisting the
messages.

- *vs the no-op relay* (target ≥ 70 %): met in every run after. The forwarding relay does the same
  fan-out, claim and ack as the no-op relay, minus a handler call per delivery, plus 0.05 ms a message
  of framing (the table above: 101 % / 91 %, measured while a test suite ran). Its database steps
  run slower than the no-op relay's (ack 0.28 s vs 0.14 s) because RabbitMQ now persists the previous batch on the same two cores at the same time.
- *vs the bare publisher* (target ≥ 60 %): not met, on MariaDB (19-35 %) nor on SQLite (29-56 %).
  The bare publisher is the broker's confirm latency alone (about 0.15 ms a message here); the relay's
  database work for a delivery (fan-out, claim with the per-key check, ack: 0.24 ms on SQLite, more on
  MariaDB with a commit flushed per transaction) is longer than that by itself, so hiding the confirm
  wait behind it cannot bring the ratio to 60 %. What would: fewer statements per delivery, e.g. a
  forward target's delivery rows inserted already leased by the fan-out (no separate claim for
  fresh events), which changes the delivery state machine and its claim SQL; not done here.
- The numbers move by half between runs on this machine (other suites share its two cores): compare
  ratios within one run, never across runs.
"""

def markdown_table(results: dict, rows: list[tuple[str, str, str]]) -> str:
    """One column per backend, one row per (title, key, format)."""
    labels = list(results)
    table = "| measure | " + " | ".join(labels) + " |\n|---|" + "---|" * len(labels) + "\n"
    for title, key, fmt in rows:
        table += f"| {title} | " + " | ".join(fmt.format(results[l][key]) for l in labels) + " |\n"
    return table


# ---- consuming -----------------------------------------------------------------------

PREFETCH = 50


def fill(broker: Broker_, n: int) -> None:
    """n persistent messages in the run's queue, as the relay publishes them (properties, JSON body)."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    items = [Claimed(i, "bench", 1, "t", now, i, "bench.write", None,
                     outbox.core.payload.dump_payload({**PAYLOAD, "i": i}), new_trace_id(), now)
             for i in range(1, n + 1)]
    client = Broker(broker.url)
    for start in range(0, n, BATCH):
        batch = [Outgoing(broker.exchange, "bench.write", item.payload.encode(), message_properties(item))
                 for item in items[start:start + BATCH]]
        assert not any(client.send(batch, 30))
    client.close()


def bare_consumer(t: Target, broker: Broker_, n: int) -> float:
    """Messages/s: basic_consume with the same prefetch, per message the same row INSERT, COMMIT, ack."""
    fill(broker, n)
    address = Broker(broker.url).address
    connection = amqp.Connection(f"{address.host}:{address.port}", userid=address.user, password=address.password,
                                 virtual_host=address.vhost)
    connection.connect()
    channel = connection.channel()
    channel.basic_qos(0, PREFETCH, False)
    inbound = deque()
    channel.basic_consume(broker.queue, callback=inbound.append)
    insert_row = handlers.rows.insert()
    done = 0
    started = time.perf_counter()
    with t.runtime.engine.connect() as db:
        while done < n:
            if not inbound:
                connection.drain_events(timeout=10)
                continue
            message = inbound.popleft()
            event_id = message.properties["application_headers"]["x-event-id"]
            json.loads(message.body)
            db.execute(insert_row.values(event_id=event_id, note="x"))
            db.commit()
            channel.basic_ack(message.delivery_tag)
            done += 1
    took = time.perf_counter() - started
    connection.close()
    return n / took


def inbox_consumer(t: Target, broker: Broker_, n: int) -> float:
    """Messages/s: QueueConsumer running bench.write (one row through ctx.session) with the inbox."""
    fill(broker, n)
    consumer = QueueConsumer(t.runtime, Broker(broker.url).address, broker.queue, prefetch=PREFETCH)
    started = time.perf_counter()
    consumer.run(Budget(max_time=600, memory_mb=None, max_handled=n))
    took = time.perf_counter() - started
    assert consumer.stats.done == n, consumer.stats
    return n / took


def count_rows(t: Target) -> int:
    with t.runtime.engine.connect() as c:
        return c.execute(text("SELECT COUNT(*) FROM bench_rows")).scalar_one()


def consume_main(args) -> None:
    broker = Broker_(args.amqp)
    results = {}
    try:
        for label, url in [("SQLite", None)] + ([("MariaDB", args.mysql)] if args.mysql else []):
            t = Target(label, url)
            try:
                r = {}
                for round_ in range(args.rounds):  # A/B/A/B: the machine's load moves between runs
                    r.setdefault("bare", []).append(bare_consumer(t, broker, args.messages))
                    r.setdefault("inbox", []).append(inbox_consumer(t, broker, args.messages))
                assert count_rows(t) == 2 * args.rounds * args.messages
                r = {k: max(v) for k, v in r.items()}
                r["ratio"] = r["inbox"] / r["bare"]
                results[label] = r
                print(label, {k: round(v, 3) for k, v in r.items()}, flush=True)
            finally:
                t.close()
    finally:
        broker.close()
    rows = [
        (f"bare consumer: py-amqp, prefetch {PREFETCH}, row INSERT + COMMIT + ack per message (messages/s)",
         "bare", "{:,.0f}"),
        ("`amqp consume` with the inbox, the same row through ctx.session (messages/s)", "inbox", "{:,.0f}"),
        ("consumer with the inbox / bare consumer (target ≥ 70 %)", "ratio", "{:.0%}"),
    ]
    table = markdown_table(results, rows)
    print(table)
    command = "python -m bench.bench_amqp --part consume" + (
        " --mysql mysql+pymysql://root:@127.0.0.1/test" if args.mysql else "")
    write_section("amqp-consume", "Consuming from RabbitMQ", command,
                  f"{args.messages:,} messages per run, durable queue, best of {args.rounds} A/B rounds.\n\n" + table
                  + CONSUME_NOTES)


CONSUME_NOTES = """
Below the 70 % target. The machine is 2 cores shared with other test suites: absolute rates moved
by half between runs of the same code, so the change was measured as runs of main (97fa53b, before)
and of this code (after) one after the other, `--messages 1500`, each run the best of its A/B rounds
(consumer with the inbox / bare consumer, SQLite / MariaDB):

| pair | load | before | after |
|---|---|---|---|
| 1 | load average ~10 | 28 % / 32 % | 42 % / 64 % |
| 2 | ~1.5 | 49 % / 46 % | 54 % / 48 %, 39 % / 43 %, 65 % / 55 % |
| 3 | ~1 | 33 % / 28 % | 50 % / 36 % (the table above) |

Median of the runs: before 33 % / 32 %, after 50 % / 48 %; best: before 49 % / 46 %, after 65 % / 64 %.

What changed:
- acks: one `basic.ack multiple` for the messages handled in a row, sent when nothing more is read
  ahead, after half the prefetch (25 here) or 0.1 s, and before the channel closes (SIGTERM,
  `--max-messages`, `--max-time`); never before the commits of every message it covers (they are
  handled in delivery order). It was one `basic.ack` (a socket write) per message, 0.9 to 2.4 ms on
  this machine; a crash before the batched ack only brings its messages again, and the inbox skips
  them (test_a_crash_before_a_batched_ack_only_brings_its_messages_again).
- the inbox INSERT is one statement built once, its values as parameters (was `insert().values()`
  built and cache-keyed per message).

Where the rest goes (cProfile of the SQLite run, 1,500 messages, ms a message under the profiler):

| part | ms | what it is |
|---|---|---|
| handler | 2.7 | `call_handler` around the bench's handler: its `ctx.session.execute(insert().values())` through the ORM session (1.9, of which the session's SAVEPOINT 0.9) |
| attempt transaction | 0.9 | `BEGIN IMMEDIATE` and the `cronbox_inbox` INSERT (primary key check) |
| commit | 0.6 | one COMMIT for the inbox row and the handler's row (the bare consumer has the same one) |
| read | 0.7 | one delivery read off the socket and parsed by py-amqp (the bare consumer has the same) |
| parse, log, ack | 0.3 | the message checked, its JSON parsed, one log line, its share of a batched ack |

- The difference to the bare consumer is the database work around the handler: two statements
  more than its INSERT + COMMIT (the inbox INSERT and the handler session's SAVEPOINT) and
  SQLAlchemy's ORM session around the handler's statement. On SQLite, where a statement costs no
  round trip, that Python is most of it; on MariaDB each extra statement is a round trip to a server
  whose commits are flushed.
- What would close the rest, not built: a handler session without its SAVEPOINT (the inbox row
  would have to be written after the handler, outside any rollback() it makes), and running
  consumers that never touch `ctx.session` without an ORM session.
"""


if __name__ == "__main__":
    main()
