"""Models and migrations agree; the schema head constant is the real head; first-use migration."""
from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import DateTime, Integer, String, Text, column, func, insert, inspect, select, table, update

from cronbox import outbox
import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SchemaError
from cronbox.outbox.core.migrate import SCHEMA_HEAD, VERSION_TABLE, alembic_config, current_revision
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.runtime import Runtime
from cronbox.outbox.events.models import Delivery, OutboxEvent
from cronbox.outbox.events.relay import Relay
from cronbox.outbox.queue.models import Job
from tests.conftest import ONE_MYSQL_MODE
from tests.helpers import deliveries, fan_out

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode changes nothing these tests check


def test_schema_head_constant_is_the_migrations_head(settings):
    assert ScriptDirectory.from_config(alembic_config(settings)).get_heads() == [SCHEMA_HEAD]


def test_models_and_migrations_agree(runtime):
    with runtime.engine.begin() as connection:
        command.check(alembic_config(runtime.settings, connection))  # raises if autogenerate finds a diff


def test_only_prefixed_tables(runtime):
    tables = set(inspect(runtime.engine).get_table_names())
    assert VERSION_TABLE in tables
    assert all(name.startswith("cronbox_") for name in tables)


def test_downgrade_to_empty_and_back(runtime):
    with runtime.engine.begin() as connection:
        command.downgrade(alembic_config(runtime.settings, connection), "base")
    assert current_revision(runtime.engine) is None
    with runtime.engine.begin() as connection:
        command.upgrade(alembic_config(runtime.settings, connection), "head")
    assert current_revision(runtime.engine) == SCHEMA_HEAD


def test_fresh_database_on_first_use(settings, database):
    runtime = Runtime(settings)
    try:
        if database.is_server:
            with pytest.raises(SchemaError, match="run `python -m cronbox migrate`"):
                runtime.ensure_schema()
        else:
            runtime.ensure_schema()  # SQLite: migrated automatically
            assert current_revision(runtime.engine) == SCHEMA_HEAD
    finally:
        runtime.dispose()


PREVIOUS_HEAD = "0010_identity_bytes"
T0 = datetime(2026, 12, 1, 9, 0, 0)


def _flights_table():
    """cronbox_flights as 0009 made it (the table 0011 drops), for writing a row at 0010."""
    return table("cronbox_flights", column("token", String), column("consumer", String), column("event_ids", Text),
                 column("size", Integer), column("first_event_id", Integer), column("last_event_id", Integer),
                 column("lease_until", DateTime), column("created_at", DateTime))


def test_upgrading_in_the_middle_of_a_flight_lands_it_as_leased_rows_delivered_after_the_lease(
        runtime, registry, rabbit):
    """A tick killed with a flight out (0009-0010 kept a forward target's fresh keyless deliveries in
    cronbox_flights while they were published): the upgrade writes them as the leased delivery rows
    they stand for (attempt 1, the flight's token and lease), and once the lease runs out a relay
    claims them like any expired lease and the broker gets them."""
    exchange = rabbit.exchange()
    queue = rabbit.queue(exchange, "#")
    cronbox.forward("*", exchange=exchange, name="fwd", registry=registry)
    # Recorded by today's record() before going down to 0010 (which has no payload_bytes column).
    with clock.frozen(T0), runtime.sessions.begin() as session:
        events = [cronbox.record(session, "thing.flew", {"n": n}) for n in range(2)]
        session.flush()
        ids = [e.id for e in events]
        session.execute(update(OutboxEvent).values(fanned_out_at=T0))
    with runtime.engine.begin() as connection:
        command.downgrade(alembic_config(runtime.settings, connection), PREVIOUS_HEAD)
    lease_until = T0 + timedelta(seconds=35)
    with runtime.engine.begin() as connection:
        connection.execute(insert(_flights_table()).values(
            token="f" * 32, consumer="fwd", event_ids=",".join(map(str, ids)), size=2, first_event_id=ids[0],
            last_event_id=ids[1], lease_until=lease_until, created_at=T0))
        command.upgrade(alembic_config(runtime.settings, connection), "head")
    assert current_revision(runtime.engine) == SCHEMA_HEAD
    assert "cronbox_flights" not in inspect(runtime.engine).get_table_names()
    landed = deliveries(runtime, consumer="fwd")
    assert [(d.event_id, d.status, d.attempts, d.claim_token, d.lease_until) for d in landed] == [
        (event_id, "pending", 1, "f" * 32, lease_until) for event_id in ids]
    runtime.settings.raw["CRONBOX_AMQP_URL"] = rabbit.url  # raw is this test's own dict
    relay = Relay(runtime)
    try:
        with clock.frozen(T0 + timedelta(seconds=30)):  # within the lease: nothing is due
            relay.run(Budget(max_time=30, memory_mb=None))
            assert rabbit.take(queue) == []
        with clock.frozen(lease_until + timedelta(seconds=1)):
            relay.run(Budget(max_time=30, memory_mb=None))
    finally:
        relay.close()
    assert sorted(json.loads(m.body)["n"] for m in rabbit.take(queue)) == [0, 1]
    assert [(d.status, d.attempts) for d in deliveries(runtime, consumer="fwd")] == [("done", 2), ("done", 2)]


def test_downgrading_below_0011_makes_the_flights_table_again_empty(runtime):
    with runtime.engine.begin() as connection:
        command.downgrade(alembic_config(runtime.settings, connection), PREVIOUS_HEAD)
    assert "cronbox_flights" in inspect(runtime.engine).get_table_names()
    with runtime.engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(_flights_table())) == 0
    with runtime.engine.begin() as connection:
        command.upgrade(alembic_config(runtime.settings, connection), "head")
        command.check(alembic_config(runtime.settings, connection))


def test_upgrading_to_0013_sizes_the_payloads_still_to_be_claimed(runtime, registry):
    """0013 adds payload_bytes (the claim's byte bound: outbox.engine.claim) and fills it, in UTF-8
    bytes on every backend, for the rows a claim may still take: events not fanned out, deliveries
    pending or dead, jobs ready, reserved or failed. What record() and dispatch() write is the same."""
    cronbox.consumer("mig.made", name="mig.take", registry=registry)(lambda event, ctx: None)
    mail = cronbox.job("mig", name="mig.mail", registry=registry)(lambda payload, ctx: None)
    wide = {"text": "é€😀 " * 50}  # 2-, 3- and 4-byte characters: bytes, not characters, are counted
    size = len(json.dumps(wide, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    with runtime.sessions.begin() as session:
        for _ in range(3):
            cronbox.record(session, "mig.made", wide)
    fan_out(runtime)
    done = deliveries(runtime)[2].id
    with runtime.sessions.begin() as session:
        cronbox.record(session, "mig.made", wide)  # not fanned out yet
        jobs = [mail.dispatch(session, wide) for _ in range(3)]
        session.execute(update(Delivery).where(Delivery.id == done).values(status="done"))
        session.execute(update(Job).where(Job.id == jobs[1]).values(status="failed"))
        session.execute(update(Job).where(Job.id == jobs[2]).values(status="done"))

    def sizes():
        with runtime.sessions() as session:
            return tuple([row.payload_bytes for row in session.scalars(select(model).order_by(model.id))]
                         for model in (OutboxEvent, Delivery, Job))

    assert sizes() == ([size] * 4, [size] * 3, [size] * 3)  # as written
    with runtime.engine.begin() as connection:
        command.downgrade(alembic_config(runtime.settings, connection), "0012_postgresql")
        command.upgrade(alembic_config(runtime.settings, connection), "head")
    assert sizes() == ([None, None, None, size], [size, size, None], [size, size, None])  # as filled
