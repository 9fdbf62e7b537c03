"""Sealed payloads (issue 40): record() and dispatch() of a 1 KB sealed payload in a one-row domain
transaction, against the same unsealed and against the floor; the drain of sealed one-row jobs
against unsealed ones.

    .venv/bin/python -m bench.bench_sealed [--mysql mysql+pymysql://root:@127.0.0.1/test] [--n 200] [--rounds 5]

Floor: the same domain INSERT and the same job INSERT (the envelope's columns) through SQLAlchemy
Core's public calls on the same engine, plus one `AESGCM.encrypt` of the payload (cryptography's
public API), no cronbox. The cases are interleaved transaction by transaction (each step runs every
case once, in an order shuffled per step) so load from the rest of the machine falls on all alike;
a ratio is the median over rounds of (floor or unsealed time / case time) within the round. The
drain alternates sealed and unsealed rounds of `--drain` jobs each (the same no-op job).
"""
from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import tempfile
import time
from datetime import datetime, timezone

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import Integer, MetaData, String, Table, Column, create_engine, insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

import cronbox
from cronbox.outbox.core import sealing
from cronbox.outbox.core.migrate import upgrade
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.queue.worker import Worker
from cronbox.storage.payload_keys import sealer_of

REGISTRY = Registry()
META = MetaData()
ORDERS = Table("bench_orders", META, Column("id", Integer, primary_key=True, autoincrement=True),
               Column("ref", String(64)), Column("amount", Integer))
PAYLOAD = {"patient": "p-1842", "text": "x" * 1000}  # ~1 KB of JSON


@cronbox.job("bench", name="bench.sealed.noop", sealed=True, registry=REGISTRY)
def sealed_noop(payload, ctx):
    pass


@cronbox.job("bench", name="bench.plain.noop", registry=REGISTRY)
def plain_noop(payload, ctx):
    pass


@cronbox.consumer("bench.sealed", name="bench.sealed.consumer", sealed=True, registry=REGISTRY)
def sealed_consumer(event, ctx):
    pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql", default=os.environ.get("TEST_MYSQL_URL"))
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--drain", type=int, default=1000)
    args = parser.parse_args()
    name = f"cronbox_bench_{secrets.token_hex(4)}"
    admin = create_engine(args.mysql, poolclass=NullPool)
    with admin.begin() as c:
        c.execute(text(f"CREATE DATABASE {name} CHARACTER SET utf8mb4"))
    folder = tempfile.mkdtemp()
    try:
        url = make_url(args.mysql).set(database=name).render_as_string(hide_password=False)
        settings = load_settings(environ={"DATABASE_URL": url, "CRONBOX_INSTANCE": folder, "CRONBOX_HANDLERS": ""})
        rt = Runtime(settings, registry=REGISTRY)
        upgrade(settings, rt.engine)
        META.create_all(rt.engine)
        sealer = sealer_of(settings)
        rt.sealer_source = lambda: sealer
        with sealing.using(sealer):
            run(rt, args)
        rt.dispose()
    finally:
        with admin.begin() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {name}"))


def run(rt, args) -> None:
    from cronbox.outbox.core.payload import dump_payload
    from cronbox.outbox.queue.models import Job

    body = dump_payload(PAYLOAD)
    aead = AESGCM(os.urandom(32))
    jobs = Job.__table__

    def order(c):
        c.execute(insert(ORDERS), {"ref": "A-1", "amount": 1250})

    def floor(c):
        order(c)
        nonce = os.urandom(12)
        envelope = "cbxp1:enc-0001-00000000:" + (nonce + aead.encrypt(nonce, body.encode(), b"ad" * 40)).hex()
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        c.execute(insert(jobs), {"queue": "floor", "handler": "floor", "payload": envelope,
                                 "payload_bytes": len(envelope), "status": "done", "attempts": 0,
                                 "available_at": now, "trace_id": secrets.token_hex(8), "created_at": now,
                                 "seal_id": secrets.token_hex(16)})

    def dispatch_plain(c):
        order(c)
        plain_noop.dispatch(c, PAYLOAD)

    def dispatch_sealed(c):
        order(c)
        sealed_noop.dispatch(c, PAYLOAD)

    def record_plain(c):
        order(c)
        cronbox.record(c, "bench.plain", PAYLOAD)

    def record_sealed(c):
        order(c)
        cronbox.record(c, "bench.sealed", PAYLOAD)

    cases = {"floor": floor, "dispatch": dispatch_plain, "dispatch sealed": dispatch_sealed,
             "record": record_plain, "record sealed": record_sealed}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        spent = dict.fromkeys(cases, 0.0)
        for _ in range(args.n):
            for label in random.sample(list(cases), len(cases)):
                started = time.perf_counter()
                with rt.engine.begin() as c:
                    cases[label](c)
                spent[label] += time.perf_counter() - started
        for label in cases:
            times[label].append(spent[label])
        with rt.engine.begin() as c:  # keep the queue empty of bench rows for the drain below
            c.execute(text("DELETE FROM cronbox_jobs"))
    print(f"record/dispatch, 1 KB payload, one-row domain transaction, MariaDB, {args.rounds} rounds of {args.n}")
    for label in cases:
        rates = [args.n / t for t in times[label]]
        print(f"  {label:16} median {statistics.median(rates):7.0f}/s  (rounds {min(rates):.0f}-{max(rates):.0f})")
    for label, against in (("dispatch sealed", "floor"), ("record sealed", "floor"), ("dispatch sealed", "dispatch"),
                           ("record sealed", "record")):
        ratios = [a / b for a, b in zip(times[against], times[label])]
        print(f"  {label} / {against}: median {statistics.median(ratios):.2f}x "
              f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")
    drains: dict[str, list[float]] = {"sealed": [], "plain": []}
    for _ in range(args.rounds):
        for label, fn in random.sample([("sealed", sealed_noop), ("plain", plain_noop)], 2):
            with rt.engine.begin() as c:
                for _ in range(args.drain):
                    fn.dispatch(c, PAYLOAD)
            worker = Worker(rt, ["bench"])
            started = time.perf_counter()
            worker.run(Budget(max_time=600, memory_mb=None))
            drains[label].append(args.drain / (time.perf_counter() - started))
    ratios = [s / p for s, p in zip(drains["sealed"], drains["plain"])]
    print(f"drain of {args.drain} one-row jobs (1 KB payload), 1 worker: sealed median "
          f"{statistics.median(drains['sealed']):.0f}/s, plain {statistics.median(drains['plain']):.0f}/s, "
          f"sealed/plain median {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
