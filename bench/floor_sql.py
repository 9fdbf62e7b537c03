"""Public-API floors on the database: the statements cronbox sends for a path, written by hand with
SQLAlchemy Core on a plain engine, no cronbox imported.

    python bench/floor_sql.py KIND URL N        (prints one JSON line: {"seconds": ..., "cpu": ...})

KIND: record, dispatch (one row per ORM Session transaction, timed in the loop), drain-peer, drain-noop (jobs
already dispatched: claim 100 with the statements of cronbox's job claim, run the body, ack the 100 with
its ack's columns), relay-noop, relay-write, relay-gwrite
(events already recorded: fan 100 out as pending delivery rows and claim 100 in one transaction,
run the consumer, ack). The engine is
set up as cronbox documents its own (MariaDB and PostgreSQL at READ COMMITTED, PostgreSQL's sessions in
UTC, through psycopg 3 as cronbox's own engines; SQLite in WAL, synchronous=NORMAL, BEGIN IMMEDIATE)
through SQLAlchemy's public events and create_engine's arguments. floor_amqp.py reuses `relay` with a
publisher.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone

from sqlalchemy import MetaData, Table, and_, bindparam, case, create_engine, event, or_, select, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

# The tick's and the worker's batch (Relay / Worker batch_size default); FLOOR_BATCH=500 shows what
# the old bench_amqp's batch of 500 was worth.
BATCH = int(os.environ.get("FLOOR_BATCH", 100))
LEASE = timedelta(seconds=60)
# The handlers the worker's claim names (those floor_handlers registers on queue "bench").
JOB_HANDLERS = ("fl.bump", "fl.noopjob")
# What the worker reads back of the jobs it claimed (one per field of its claimed job).
CLAIMED = ("id", "queue", "handler", "payload", "attempts", "claim_token", "available_at", "retry_until", "trace_id",
           "concurrency_group", "cost")
PSYCOPG = "postgresql+psycopg"  # the driver cronbox's own engines use on PostgreSQL, whatever the URL names
ROW_INSERT = text("INSERT INTO bench_floor_rows (event_id, note) VALUES (:event_id, 'x')")


def engine_for(url: str):
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):
            dbapi_connection.isolation_level = None
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
                dbapi_connection.execute(f"PRAGMA {pragma}")

        @event.listens_for(engine, "begin")
        def _begin(connection):
            connection.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgres"):
        return create_engine(psycopg_url(url), isolation_level="READ COMMITTED",
                             connect_args={"options": "-c TimeZone=UTC"})
    return create_engine(url, isolation_level="READ COMMITTED", connect_args={"ssl_disabled": True})


def psycopg_url(url: str) -> str:
    """A PostgreSQL URL (`postgresql://`, `postgres://`, any driver) with psycopg 3 as its driver."""
    return make_url(url).set(drivername=PSYCOPG).render_as_string(hide_password=False)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def tables(engine) -> MetaData:
    metadata = MetaData()
    for name in ("cronbox_events", "cronbox_deliveries", "cronbox_jobs"):
        Table(name, metadata, autoload_with=engine)
    return metadata


def row_of(table: Table, values: dict) -> dict:
    """`values` as the driver takes them: cronbox stores names as VARBINARY on MySQL (exact
    comparison), so a str goes in as its UTF-8 bytes there."""
    return {k: v.encode() if isinstance(v, str) and _binary(table.c[k]) else v for k, v in values.items()}


def ident(table: Table, column: str, value):
    return row_of(table, {column: value})[column]


def _binary(column) -> bool:
    try:
        return column.type.python_type is bytes
    except NotImplementedError:
        return False


def text_of(value):
    return value.decode() if isinstance(value, bytes) else value


def record(engine, n: int, t: MetaData) -> None:
    events = t.tables["cronbox_events"]
    insert = events.insert()
    for i in range(n):
        now = utcnow()
        with Session(engine) as s, s.begin():  # the caller's ORM transaction, as record() gets it
            s.connection().execute(insert, row_of(events, {"type": "fl.noop", "key": None, "payload": json.dumps({"i": i}),
                                              "trace_id": uuid.uuid4().hex, "created_at": now, "available_at": now}))


def dispatch(engine, n: int, t: MetaData) -> None:
    jobs = t.tables["cronbox_jobs"]
    insert = jobs.insert()
    for _i in range(n):
        now = utcnow()
        with Session(engine) as s, s.begin():
            s.connection().execute(insert, row_of(jobs, {"queue": "bench", "handler": "fl.bump", "payload": "null",
                                            "status": "ready", "attempts": 0, "available_at": now,
                                            "trace_id": uuid.uuid4().hex, "created_at": now}))


def skip_locked(query, engine):
    return query if engine.dialect.name == "sqlite" else query.with_for_update(skip_locked=True)


def claim_jobs(engine, c, jobs: Table, now):
    """The worker's claim of one queue: a reserved job whose lease ran out, alone, else up to BATCH
    ready ones; each read locked with FOR UPDATE SKIP LOCKED, in (available_at, id) order."""
    for status, size in (("reserved", 1), ("ready", BATCH)):
        ids = c.scalars(skip_locked(
            select(jobs.c.id).where(jobs.c.queue == ident(jobs, "queue", "bench"), jobs.c.status == status,
                                    jobs.c.available_at <= now,
                                    jobs.c.handler.in_([ident(jobs, "handler", h) for h in JOB_HANDLERS]))
            .order_by(jobs.c.available_at, jobs.c.id).limit(size), engine)).all()
        if ids:
            return ids
    return []


def drain(engine, body) -> int:
    """Claim due jobs as the worker does (claim_jobs), stamp them reserved under a token and read back
    the columns it reads; run each body; ack the batch in one UPDATE writing the columns its ack writes."""
    jobs = tables(engine).tables["cronbox_jobs"]
    done = 0
    while True:
        now, token = utcnow(), uuid.uuid4().hex
        with engine.begin() as c:
            ids = claim_jobs(engine, c, jobs, now)
            if not ids:
                return done
            c.execute(update(jobs).where(jobs.c.id.in_(ids)).values(
                status="reserved", claim_token=ident(jobs, "claim_token", token), attempts=jobs.c.attempts + 1, available_at=now + LEASE,
                reserved_at=now))
            claimed = c.execute(select(*(jobs.c[name] for name in CLAIMED)).where(jobs.c.id.in_(ids))).all()
        for row in claimed:
            body(json.loads(row.payload))
        with engine.begin() as c:
            c.execute(update(jobs).where(jobs.c.id.in_(ids), jobs.c.claim_token == ident(jobs, "claim_token", token), jobs.c.status == "reserved")
                      .values(status="done", available_at=None, claim_token=None, unique_key=None,
                              finished_at=utcnow(), last_error=None, error_class=None, traceback=None))
        done += len(ids)


def insert_ignoring_duplicates(table: Table, engine):
    """INSERT that skips a row already there (cronbox's fan-out may race another relay's); on PostgreSQL
    ON CONFLICT DO NOTHING, returning the keys it added as cronbox's does."""
    if engine.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing().returning(*table.primary_key.columns)
    return table.insert().prefix_with("OR IGNORE" if engine.dialect.name == "sqlite" else "IGNORE")


def claim_events(engine, c, t, consumer: str):
    """The relay's batch transaction since issue 25: fan the next BATCH events out to `consumer` as
    pending delivery rows, then claim what is due (FOR UPDATE SKIP LOCKED, leased under a token) and
    read the claimed rows with their events; returns (token, rows), each row's `id` its event's."""
    events, deliveries = t.tables["cronbox_events"], t.tables["cronbox_deliveries"]
    now, token = utcnow(), uuid.uuid4().hex
    fresh = c.execute(select(events.c.id, events.c.key).where(events.c.fanned_out_at.is_(None))
                      .order_by(events.c.id).limit(BATCH)).all()
    if fresh:
        c.execute(insert_ignoring_duplicates(deliveries, engine), [row_of(deliveries, {
            "event_id": r.id, "consumer": consumer, "key": r.key, "status": "pending", "attempts": 0,
            "next_attempt_at": now, "created_at": now}) for r in fresh])
        c.execute(update(events).where(events.c.id.in_([r.id for r in fresh]), events.c.fanned_out_at.is_(None))
                  .values(fanned_out_at=now))
    due = c.scalars(skip_locked(
        select(deliveries.c.id).where(deliveries.c.status == "pending", deliveries.c.claim_token.is_(None),
                                      deliveries.c.next_attempt_at <= now)
        .order_by(deliveries.c.id).limit(BATCH), engine)).all()
    if not due:
        return token, []
    c.execute(update(deliveries).where(deliveries.c.id.in_(due)).values(
        claim_token=ident(deliveries, "claim_token", token), attempts=deliveries.c.attempts + 1, lease_until=now + LEASE))
    rows = c.execute(
        select(events.c.id, events.c.type, events.c.key, events.c.payload, events.c.trace_id, events.c.created_at)
        .join(deliveries, deliveries.c.event_id == events.c.id).where(deliveries.c.id.in_(due))
        .order_by(deliveries.c.id)).all()
    return token, rows


def ack_deliveries(c, t, token: str, event_ids) -> None:
    deliveries = t.tables["cronbox_deliveries"]
    c.execute(update(deliveries).where(deliveries.c.event_id.in_(event_ids), deliveries.c.claim_token == ident(deliveries, "claim_token", token))
              .values(status="done", claim_token=None, lease_until=None, finished_at=utcnow()))


def relay(engine, consumer: str, handle_batch) -> int:
    """Fan-out-and-claim a batch in one transaction, then `handle_batch(token, rows)`; until none are left."""
    t = tables(engine)
    done = 0
    while True:
        with engine.begin() as c:
            token, rows = claim_events(engine, c, t, consumer)
        if not rows:
            return done
        handle_batch(t, token, rows)
        done += len(rows)


def relay_handlers(engine):
    deliveries_done = update(tables(engine).tables["cronbox_deliveries"]).where(
        text("event_id = :eid AND claim_token = :token")).values(status="done", claim_token=None, lease_until=None,
                                                                   finished_at=bindparam("now"))

    def noop(t, token, rows):
        for r in rows:
            json.loads(r.payload)
        with engine.begin() as c:
            ack_deliveries(c, t, token, [r.id for r in rows])

    def write(t, token, rows):
        """One transaction per delivery: the consumer's row in a savepoint (ctx.session's, so a
        handler's failure keeps the ack's transaction usable), then its ack, one COMMIT."""
        for r in rows:
            json.loads(r.payload)
            with engine.begin() as c:
                with c.begin_nested():
                    c.execute(ROW_INSERT, {"event_id": r.id})
                c.execute(deliveries_done, {"eid": r.id, "token": ident(t.tables["cronbox_deliveries"], "claim_token", token),
                                            "now": utcnow()})

    def gwrite(t, token, rows):
        """Group commit: a savepoint per delivery's row, one ack and one COMMIT for the batch."""
        with engine.begin() as c:
            for r in rows:
                json.loads(r.payload)
                with c.begin_nested():
                    c.execute(ROW_INSERT, {"event_id": r.id})
            ack_deliveries(c, t, token, [r.id for r in rows])

    return {"noop": noop, "write": write, "gwrite": gwrite}


# ---- jobs on RabbitMQ (issue 28): the statements of outbox.queue.jobstore's publisher claim, lease
# and the broker worker's take and ack, for floor_amqp's jobs-publish and jobs-work.
JOBS_QUEUE, JOB_WRITE = "fl.jobs", "fl.jobwrite"  # floor_handlers' forwarded queue and its one-row job
PUBLISH_BATCH = 500  # the job publisher's batch (outbox.queue.publisher.BATCH)
PUBLISH_LEASE = timedelta(seconds=10 + 30)  # the claim's lease: confirm wait (10 s) + CRONBOX_LEASE_MARGIN
REPUBLISH_AFTER = timedelta(seconds=1800)  # forward_jobs' default: the lease once the broker confirmed


PAIRS_PER_STATEMENT = 300  # jobstore's: (id, token) pairs per statement


def _chunks(items: list):
    return [items[start:start + PAIRS_PER_STATEMENT] for start in range(0, len(items), PAIRS_PER_STATEMENT)]


def _paired(jobs: Table, pairs):
    """jobstore._paired: rows by (id, token), each id with its own token, the ids for the primary key."""
    return and_(jobs.c.id.in_([job_id for job_id, _t in pairs]),
                or_(*(and_(jobs.c.id == job_id, jobs.c.claim_token == ident(jobs, "claim_token", t))
                      for job_id, t in pairs)))


def claim_to_publish(engine, c, jobs: Table, now):
    """jobstore.claim_to_publish for one queue, nothing expired: the reserved jobs whose lease ran out
    (none here), then up to PUBLISH_BATCH ready ones, each read locked with FOR UPDATE SKIP LOCKED
    (SQLite: plain, under BEGIN IMMEDIATE), stamped reserved under a new token, given a token each
    (one UPDATE per PAIRS_PER_STATEMENT jobs) and read back. Returns the rows."""
    token = uuid.uuid4().hex
    queue, handlers = ident(jobs, "queue", JOBS_QUEUE), [ident(jobs, "handler", JOB_WRITE)]

    def candidates(status):
        return skip_locked(select(jobs.c.id).where(jobs.c.queue == queue, jobs.c.status == status,
                                                   jobs.c.available_at <= now, jobs.c.handler.in_(handlers))
                           .order_by(jobs.c.available_at, jobs.c.id).limit(PUBLISH_BATCH), engine)

    assert not c.scalars(candidates("reserved")).all()  # the bench never lets a lease run out
    ids = c.scalars(candidates("ready")).all()
    if not ids:
        return []
    c.execute(update(jobs).where(jobs.c.id.in_(ids)).values(
        claim_token=ident(jobs, "claim_token", token), status="reserved", available_at=now + PUBLISH_LEASE))
    for chunk in _chunks(ids):
        c.execute(update(jobs).where(jobs.c.id.in_(chunk), jobs.c.claim_token == ident(jobs, "claim_token", token))
                  .values(claim_token=case({i: ident(jobs, "claim_token", uuid.uuid4().hex) for i in chunk},
                                           value=jobs.c.id)))
    return c.execute(select(*(jobs.c[name] for name in CLAIMED)).where(jobs.c.id.in_(ids))).all()


def published(c, jobs: Table, rows, lease_until) -> int:
    """jobstore.published: the confirmed jobs' lease extended (never shortened), guarded by each job's token."""
    later = case((jobs.c.available_at > lease_until, jobs.c.available_at), else_=lease_until)
    pairs = [(r.id, text_of(r.claim_token)) for r in rows]
    return sum(c.execute(update(jobs).where(_paired(jobs, chunk), jobs.c.status == "reserved")
                         .values(available_at=later)).rowcount for chunk in _chunks(pairs))


JOB_TIMEOUT = 30  # floor_handlers' one-row job: its lease at the take is timeout + CRONBOX_LEASE_MARGIN (30 s)


def job_take(c, jobs: Table, named: list[tuple[int, str]], now):
    """jobstore.take: the rows the messages name read (with their status and queue, to check each
    message's own token), then the ones still reserved under it stamped with a token of the worker's
    own, the attempt counted and the handler's lease, by (id, token) pairs. Returns (token, rows as read)."""
    token = uuid.uuid4().hex
    ids = list(dict.fromkeys(job_id for job_id, _token in named))
    rows = c.execute(select(*(jobs.c[name] for name in CLAIMED), jobs.c.status).where(jobs.c.id.in_(ids))).all()
    by_id = {r.id: r for r in rows}
    assert all(text_of(by_id[i].claim_token) == t for i, t in named)  # the bench sends only its own
    c.execute(update(jobs).where(_paired(jobs, named), jobs.c.status == "reserved",
                                 jobs.c.queue.in_([ident(jobs, "queue", JOBS_QUEUE)]),
                                 jobs.c.handler.in_([ident(jobs, "handler", JOB_WRITE)])).values(
        claim_token=ident(jobs, "claim_token", token), attempts=jobs.c.attempts + 1, reserved_at=now,
        available_at=now + timedelta(seconds=JOB_TIMEOUT + 30)))
    return token, rows


def job_ack(jobs: Table):
    """jobstore.ACK: done, guarded by the token, the eight columns the worker's ack writes."""
    return (update(jobs).where(jobs.c.id.in_(bindparam("ids", expanding=True)), jobs.c.claim_token == bindparam("token"),
                               jobs.c.status == "reserved")
            .values(status="done", available_at=None, claim_token=None, unique_key=None, finished_at=bindparam("now"),
                    last_error=None, error_class=None, traceback=None))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(kind: str, url: str, n: int) -> None:
    engine = engine_for(url)
    t = tables(engine)  # record and dispatch are timed in the loop, as floor_host times cronbox's
    started, cpu = time.perf_counter(), cpu_seconds()
    if kind in ("record", "dispatch"):
        (record if kind == "record" else dispatch)(engine, n, t)
    elif kind in ("drain-peer", "drain-noop"):
        from common import bump  # bench/peers/common.py: the peer harness's job body

        assert drain(engine, (lambda payload: bump()) if kind == "drain-peer" else (lambda payload: None)) == n
    elif kind in ("relay-noop", "relay-write", "relay-gwrite"):
        consumer = {"relay-noop": "fl.noop", "relay-write": "fl.write", "relay-gwrite": "fl.gwrite"}[kind]
        assert relay(engine, consumer, relay_handlers(engine)[kind.split("-")[1]]) == n
    else:
        raise SystemExit(f"unknown kind {kind}")
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu": cpu_seconds() - cpu}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
