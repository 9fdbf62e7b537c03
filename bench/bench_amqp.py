"""Forwarding benchmark: the relay publishing to RabbitMQ with confirms, against a bare publisher
and cronbox's own no-op relay, in one run.

    .venv/bin/python -m bench.bench_amqp [--mysql mysql+pymysql://root:@127.0.0.1/test] [--events 5000]
                                         [--amqp amqp://guest:guest@127.0.0.1:5672/]

- bare publisher: the same client (py-amqp), the same persistent messages with the same properties,
  publisher confirms and mandatory, batches of the same size (500), no database;
- relay → RabbitMQ: events recorded beforehand, one relay run forwarding them (claim, publish the
  batch, collect its confirms, ack the confirmed);
- no-op relay: the same events relayed to an in-process consumer that does nothing.
The exchange and queue (durable, so the broker writes the persistent messages to disk) are made
for the run and deleted after it. Prints a table and rewrites the "Forwarding to RabbitMQ" section
of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import secrets
import time
from datetime import datetime, timezone

import amqp

import outbox
from bench.bench_outbox import Target, bulk_record, relay_rate
from bench.report import write_section
from outbox.engine.budget import Budget
from outbox.events.broker import Broker, Outgoing
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
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
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
        (f"bare publisher, py-amqp, persistent + confirms, batches of {BATCH} (messages/s)", "bare", "{:,.0f}"),
        (f"relay → RabbitMQ with confirms, {args.events:,} events (deliveries/s)", "forward", "{:,.0f}"),
        ("relay to a no-op consumer, same events (deliveries/s)", "noop", "{:,.0f}"),
        ("share of that relay run inside the broker client (publishing, reading confirms not yet in)", "in_client",
         "{:.0%}"),
        ("relay → RabbitMQ / bare publisher (target ≥ 60 %)", "vs_bare", "{:.0%}"),
        ("relay → RabbitMQ / no-op relay (target ≥ 70 %)", "vs_noop", "{:.0%}"),
    ]
    labels = list(results)
    table = "| measure | " + " | ".join(labels) + " |\n|---|" + "---|" * len(labels) + "\n"
    for title, key, fmt in rows:
        table += f"| {title} | " + " | ".join(fmt.format(results[l][key]) for l in labels) + " |\n"
    print(table)
    command = "python -m bench.bench_amqp" + (" --mysql mysql+pymysql://root:@127.0.0.1/test" if args.mysql else "")
    command += f" (best of {args.rounds} interleaved rounds)"
    write_section("amqp", "Forwarding to RabbitMQ", command, table + NOTES)


NOTES = """
Where the time goes (cProfile of the SQLite run, 3,000 events): the forwarding relay's time is the
broker client's (publishing and collecting confirms, the row "share ... inside the broker client") plus
the same database work the no-op relay does (fan-out, claim with the per-key check, one batched ack
UPDATE per batch, a log line per delivery); nothing overlaps, the tick being one synchronous thread.

- *vs the bare publisher*: the rest is the database: fan-out, claim and ack of each batch of 500. On
  MariaDB (here a loaded 2-core machine where every commit is flushed) that is the larger half.
- *vs the no-op relay*: the rest is py-amqp's per-message cost in this process: serializing each
  message's properties and headers (about 0.2 ms a message in pure Python), framing it, and reading one
  basic.ack frame per message. The batch's frames already go out in one write per 256 KiB (one
  `sendall` per message was the largest single cost before); publisher confirms are collected per
  batch, never waited for one by one.
- Of the client's time, about half is publishing (0.18 ms a message: properties, framing, the
  coalesced writes) and half waiting for and reading the confirms (0.17 ms a message, one basic.ack
  frame each; measured once, batches of 500, durable queue).
- The two targets add up to more than the two costs allow while they run one after the other: a
  relay at 60 % of the bare publisher and 70 % of the no-op relay needs the broker's confirm latency
  and the database work to overlap (publish batch N+1 while N's confirms are in flight; per-key order
  would hold, since a key's delivery in flight keeps its later ones out of the next claim). Not built:
  it would hide at most the confirm wait, so even then the no-op target is out of reach with py-amqp's
  pure-Python framing.
- The numbers move a lot between runs on this machine (other test suites share its two cores): the
  no-op relay measured 5,864/s on MariaDB in the Outbox section above, a fifth of that here.
"""

if __name__ == "__main__":
    main()
