"""Identities compare bytes on every backend (issue 24): ids that differ only by case, trailing
space, accent, Unicode normalisation or a supplementary character are different rows and different
lookups, on SQLite and on MariaDB (whose default collation folds all of those, and whose `_bin`
collations still pad spaces); and migration 0010 converts a database with rows in it."""
from __future__ import annotations

import unicodedata

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Integer, UniqueConstraint, func, insert, inspect, select
from sqlalchemy.exc import IntegrityError

import cronbox
from cronbox.cron.schema import metadata
from cronbox.outbox.core import clock
from cronbox.outbox.core.migrate import SCHEMA_HEAD, alembic_config, current_revision
from cronbox.outbox.core.sql import starts_with
from cronbox.outbox.events import redeliveries
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import RateWindow
from cronbox.outbox.queue.ratelimit import RateLimit
from tests.broker_rows import inbox_count, inbox_has, redelivery_times, take
from tests.conftest import ONE_MYSQL_MODE
from tests.db.test_consume import behaviour, consume, publish, queue, rows  # noqa: F401 (fixtures)
from tests.db.test_queue import all_jobs, work
from tests.helpers import deliveries, relay

BEFORE_0010 = "0010_identity_bytes-1"  # the revision 0010 upgrades from

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode changes nothing these tests check

# Pairwise different strings that a case-/accent-insensitive or PAD SPACE comparison takes for one.
VARIANTS = [
    "msg-a", "MSG-A", "Msg-a",
    "msg-a ", "msg-a  ", "msg-a\t",  # PAD SPACE pads spaces only: the tab is the control
    "msg-\u00e1", unicodedata.normalize("NFD", "msg-\u00e1"), "msg-\u00e4", "msg-\uff41",  # NFC, NFD, umlaut, fullwidth
    "msg-ss", "msg-\u00df",  # general_ci takes "ß" for "s", unicode_ci for "ss"
    "msg-\U0001f600", "msg-\U0001f601",  # general_ci weighs every supplementary character alike
    "", " ",
]
assert len(set(VARIANTS)) == len(VARIANTS)

# Every column cronbox compares as an identity, per table: named here, not read from the models, so
# that a column turned back into a collated VARCHAR fails these tests.
IDENTITIES = {
    "cronbox_events": ["type", "key"],
    "cronbox_deliveries": ["consumer", "key", "claim_token"],
    "cronbox_inbox": ["consumer", "message_id"],
    "cronbox_redeliveries": ["queue", "message_id"],
    "cronbox_jobs": ["queue", "handler", "claim_token", "unique_key", "concurrency_group", "idempotency_key"],
    "cronbox_rate_windows": ["bucket"],
    "cronbox_channel_pauses": ["channel"],
    "cronbox_group_slots": ["group_name", "holder"],
    "cronbox_heartbeats": ["command", "host", "detail"],
    "cronbox_handler_profiles": ["kind", "handler"],
    "cronbox_schedule_runs": ["task"],
    "cronbox_alert_states": ["problem"],
    "cronbox_ops_sessions": ["id_hash"],
    "cronbox_notifications": ["recipient", "dedupe_key"],
    "cronbox_send_attempts": ["channel", "idempotency_key"],
    "cronbox_files": ["id", "owner", "key_id"],
    "cronbox_grants": ["id", "file_id", "subject"],
    "cronbox_grant_uses": ["grant_id", "jti_hash"],
    "cronbox_file_audit": ["file_id", "grant_id", "subject", "jti_hash"],
}
IDENTITY_COLUMNS = [(table, column) for table, columns in IDENTITIES.items() for column in columns]


class Rows:
    """Inserts rows of any cronbox table with every required column filled, parents first (the
    foreign keys), so that a test varies one column and nothing else."""

    def __init__(self, connection, serial: bool = False):
        self.connection = connection
        self.serial = serial  # fill the primary key's columns with a new value for each row
        self.made = 0
        self.parents: dict[tuple[str, str], set] = {}
        self.now = clock.utcnow()

    def filler(self, column):
        python_type = column.type.python_type
        n = self.made if self.serial and column.primary_key else ""
        if python_type is str:
            return f"base{n}"
        if python_type is bytes:
            return b"x"
        if python_type is bool:
            return False
        if python_type is int:
            return n or 0
        return self.now  # the DATETIME columns

    def insert(self, table, values: dict):
        row = dict(values)
        for column in table.columns:
            if column.name in row or column is table.autoincrement_column or column.foreign_keys:
                continue
            if not column.nullable or column.primary_key:
                row[column.name] = self.filler(column)
        for fk in table.foreign_keys:
            name, target = fk.parent.name, fk.column
            if isinstance(target.type, Integer):  # an id the parent's INSERT gives
                if name not in row:
                    row[name] = self.insert(target.table, {})
                continue
            value = row.setdefault(name, "base")
            made = self.parents.setdefault((target.table.name, target.name), set())
            if value not in made:
                self.insert(target.table, {target.name: value})
                made.add(value)
        self.made += 1
        return self.connection.execute(insert(table).values(row)).inserted_primary_key[0]


def test_the_list_names_every_identity_column_of_the_models():
    """The models' identity type and this list agree (a new identity column is added to both)."""
    from cronbox.outbox.core.models import ExactString
    assert {(t.name, c.name) for t in metadata.tables.values() for c in t.columns
            if isinstance(c.type, ExactString)} == set(IDENTITY_COLUMNS)


@pytest.mark.parametrize("table_name,column_name", IDENTITY_COLUMNS, ids=[".".join(p) for p in IDENTITY_COLUMNS])
def test_ids_differing_by_case_space_or_accent_are_distinct_rows_and_lookups(runtime, table_name, column_name):
    table = metadata.tables[table_name]
    column = table.c[column_name]
    values = [v[:column.type.length] for v in VARIANTS]
    assert len(set(values)) == len(VARIANTS)
    keyed = column.primary_key or column.unique or any(
        column.name in c.columns for c in table.constraints if isinstance(c, UniqueConstraint))
    with runtime.engine.begin() as connection:
        rows_ = Rows(connection, serial=not keyed)  # a key column varies alone; any other, with a new key
        for value in values:
            rows_.insert(table, {column_name: value})  # a unique or primary key takes every one
    with runtime.engine.connect() as connection:
        for value in values:
            found = connection.scalars(select(column).where(column == value)).all()
            assert found == [value], (value, found)
            assert type(found[0]) is str
        assert sorted(connection.scalars(select(column).where(column.in_(values[:3])))) == sorted(values[:3])
        assert connection.scalar(select(func.count(column.distinct()))) == len(values)
        assert sorted(connection.scalars(select(column).group_by(column))) == sorted(values)


def test_inbox_takes_message_ids_differing_by_case_space_or_accent_once_each(runtime):
    now = clock.utcnow()
    assert [take(runtime, "a", mid, now) for mid in VARIANTS] == [True] * len(VARIANTS)
    assert [take(runtime, "A", mid, now) for mid in VARIANTS] == [True] * len(VARIANTS)
    assert not take(runtime, "a", VARIANTS[0], now)
    assert take(runtime, "a", "MSG-\u00c1", now)
    with runtime.sessions() as session:
        assert inbox_count(session, "a") == len(VARIANTS) + 1 and inbox_count(session, "A") == len(VARIANTS)
        assert all(inbox_has(session, "a", mid) for mid in VARIANTS) and not inbox_has(session, "a", "msg-A")


def test_redelivery_counts_are_kept_per_exact_message_id(runtime):
    now = clock.utcnow()
    with runtime.sessions.begin() as session:
        for n, mid in enumerate(VARIANTS):
            for _ in range(n + 1):
                redeliveries.count(session, "q", mid, now)
    with runtime.sessions.begin() as session:
        assert [redelivery_times(session, "q", mid) for mid in VARIANTS] == list(range(1, len(VARIANTS) + 1))
        assert redelivery_times(session, "Q", "msg-a") == 0
        redeliveries.forget(session, "q", "MSG-A")
    with runtime.sessions() as session:
        assert redelivery_times(session, "q", "msg-a") == 1 and redelivery_times(session, "q", "MSG-A") == 0


def test_amqp_consume_runs_each_consumer_for_message_ids_differing_only_by_case_space_or_accent(
        runtime, rabbit, queue, behaviour):
    ids = [mid for mid in VARIANTS if mid.strip()]  # a blank message id is a bad message
    for n, mid in enumerate(ids):
        publish(rabbit, queue, n, message_id=mid)
    publish(rabbit, queue, 0, message_id=ids[0])  # a true duplicate is still one
    consumer_, result = consume(runtime, rabbit, queue, messages=len(ids) + 1)
    assert result.exit_code == 0
    assert sorted(rows(runtime)) == sorted((name, n, 1) for n in range(len(ids)) for name in "ab")
    assert consumer_.stats.done == len(ids) and consumer_.stats.duplicates == 1
    with runtime.sessions() as session:
        assert all(inbox_has(session, name, mid) for mid in ids for name in "ab")


def test_unique_job_keys_differing_only_by_case_space_or_accent_are_separate_jobs(runtime, registry):
    ran = []

    @job(name="once", registry=registry)
    def once(payload, ctx):
        ran.append(payload["n"])

    keys = [key for key in VARIANTS if key]  # an empty key is refused
    with runtime.sessions.begin() as session:
        assert all(once.dispatch(session, {"n": n}, unique_key=key) is not None for n, key in enumerate(keys))
        assert once.dispatch(session, {"n": -1}, unique_key="MSG-A") is None  # the same key is still one job
    assert len(all_jobs(runtime)) == len(keys)
    work(runtime)
    assert sorted(ran) == list(range(len(keys)))


def test_event_keys_differing_only_by_case_are_separate_ordering_keys(runtime, registry):
    """A failing delivery holds back later ones of its key only: not those of 'K', 'k ' or 'ḱ'."""
    delivered = []

    @consumer("step", name="ordered", backoff=[600], registry=registry)
    def ordered(event, ctx):
        if event.key == "k" and event.payload["n"] == 1:
            raise RuntimeError("transient")
        delivered.append((event.key, event.payload["n"]))

    keys = ["k", "K", "k ", "k\t", "\u1e31", unicodedata.normalize("NFD", "\u1e31")]
    with runtime.sessions.begin() as session:
        for key in keys:
            cronbox.record(session, "step", {"n": 1}, key=key)
            cronbox.record(session, "step", {"n": 2}, key=key)
    relay(runtime)
    assert sorted(delivered) == sorted((key, n) for key in keys[1:] for n in (1, 2))  # "k" 2 waits behind 1
    assert sorted(d.key for d in deliveries(runtime, status="pending")) == ["k", "k"]


def _insert_at_0009(connection, rows_):
    """Rows the 0009 schema takes (no two differ by case only: its collation would refuse them)."""
    events = metadata.tables["cronbox_events"]
    rows_.insert(metadata.tables["cronbox_inbox"], {"consumer": "c\u00e9", "message_id": "Msg-\U0001f600"})
    rows_.insert(metadata.tables["cronbox_jobs"], {"unique_key": "job:K\u00e4se", "queue": "sms"})
    rows_.insert(metadata.tables["cronbox_grant_uses"], {"grant_id": "g1", "jti_hash": "J1"})
    event = rows_.insert(events, {"key": "Patient:\u00df", "type": "step"})
    rows_.insert(metadata.tables["cronbox_deliveries"], {"event_id": event, "consumer": "C", "key": "Patient:\u00df"})
    rows_.insert(metadata.tables["cronbox_heartbeats"], {"detail": None})


# Columns added after 0009 (0013's payload_bytes, 0014's seal_id, 0015's batch and idempotency columns):
# not there to read at 0009, and filled by the upgrade.
LATER_COLUMNS = {"payload_bytes", "seal_id", "batch_id", "flow", "idempotency_key", "idempotency_until"}


def _snapshot(connection) -> dict:
    def columns(name):
        return [c for c in metadata.tables[name].columns if c.name not in LATER_COLUMNS]

    return {name: sorted(tuple(str(v) for v in row) for row in connection.execute(select(*columns(name))))
            for name in ("cronbox_inbox", "cronbox_jobs", "cronbox_grant_uses", "cronbox_grants", "cronbox_files",
                         "cronbox_events", "cronbox_deliveries", "cronbox_heartbeats")}


def test_upgrading_a_database_at_0009_with_rows_keeps_them_and_then_tells_ids_apart(runtime):
    with runtime.engine.begin() as connection:
        command.downgrade(alembic_config(runtime.settings, connection), BEFORE_0010)
    assert current_revision(runtime.engine) == ScriptDirectory.from_config(
        alembic_config(runtime.settings)).get_revision("0010_identity_bytes").down_revision
    with runtime.engine.begin() as connection:
        _insert_at_0009(connection, Rows(connection))
    with runtime.engine.connect() as connection:
        before = _snapshot(connection)
    with runtime.engine.begin() as connection:
        command.upgrade(alembic_config(runtime.settings, connection), "head")
    assert current_revision(runtime.engine) == SCHEMA_HEAD
    with runtime.engine.connect() as connection:
        assert _snapshot(connection) == before
        assert connection.scalar(select(func.count()).select_from(metadata.tables["cronbox_inbox"])) == 1
    fks = {fk["name"] for name in ("cronbox_grants", "cronbox_grant_uses")
           for fk in inspect(runtime.engine).get_foreign_keys(name)}
    assert fks == {"fk_cronbox_grants_file_id_cronbox_files", "fk_cronbox_grant_uses_grant_id_cronbox_grants"}
    with runtime.engine.begin() as connection:
        Rows(connection).insert(metadata.tables["cronbox_inbox"], {"consumer": "c\u00e9", "message_id": "msg-\U0001f600"})
    if runtime.engine.dialect.name != "sqlite":  # where 0010 dropped and made them again
        with runtime.engine.begin() as connection, pytest.raises(IntegrityError):  # a grant use needs its grant
            connection.execute(insert(metadata.tables["cronbox_grant_uses"]).values(
                grant_id="G1", jti_hash="j", first_at=clock.utcnow(), last_at=clock.utcnow(), requests=1))


def test_downgrading_keeps_rows_and_upgrading_again_is_the_same_schema(runtime):
    with runtime.engine.begin() as connection:
        _insert_at_0009(connection, Rows(connection))
    with runtime.engine.connect() as connection:
        before = _snapshot(connection)
    config = alembic_config(runtime.settings)
    with runtime.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, BEFORE_0010)
    with runtime.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    with runtime.engine.begin() as connection:
        assert _snapshot(connection) == before
        config.attributes["connection"] = connection
        command.check(config)  # the models and the upgraded schema agree


@pytest.mark.backends("mysql-skip-locked")
def test_upgrading_ids_a_latin1_database_stored_keeps_them_as_text(runtime):
    """A host database whose default character set is latin1 gave 0001-0009's columns latin1: the
    upgrade converts that text to UTF-8 before keeping its bytes, so 'é' still reads as 'é'."""
    inbox_table = metadata.tables["cronbox_inbox"]
    with runtime.engine.begin() as connection:
        command.downgrade(alembic_config(runtime.settings, connection), BEFORE_0010)
    with runtime.engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE cronbox_inbox MODIFY message_id VARCHAR(191) CHARACTER SET latin1 "
                                   "NOT NULL, MODIFY consumer VARCHAR(191) CHARACTER SET latin1 NOT NULL")
        connection.exec_driver_sql(  # text, as 0009's code sent it (the server converts it to latin1)
            "INSERT INTO cronbox_inbox (consumer, message_id, event_type, received_at) VALUES (%s, %s, 't', NOW())",
            ("caf\u00e9", "M\u00e9-1"))
    with runtime.engine.begin() as connection:
        command.upgrade(alembic_config(runtime.settings, connection), "head")
    with runtime.engine.connect() as connection:
        assert connection.execute(select(inbox_table.c.consumer, inbox_table.c.message_id)).all() == [
            ("caf\u00e9", "M\u00e9-1")]
    with runtime.sessions() as session:
        assert inbox_has(session, "caf\u00e9", "M\u00e9-1") and not inbox_has(session, "cafe", "M\u00e9-1")


def _windows(runtime) -> list[tuple[str, int]]:
    with runtime.sessions() as session:
        return sorted(tuple(row) for row in session.execute(select(RateWindow.bucket, RateWindow.used)))


@pytest.mark.parametrize("prefix,matching,others", [
    ("ops-login:", ["ops-login:a", "ops-login:\u00e9", "ops-login:"],
     ["OPS-LOGIN:a", "Ops-login:b", "ops-login", "ops-login;", "ops-loginX", "ops-login :a", "queue:ops-login:a"]),
    ("a_b%:", ["a_b%:1"], ["axb%:1", "a_bz:1", "A_B%:1", "a_b%"]),  # LIKE's wildcards are plain characters here
    ("caf\u00e9:", ["caf\u00e9:1"], ["cafe:1", "CAF\u00c9:1", unicodedata.normalize("NFD", "caf\u00e9:1")]),
])
def test_starts_with_is_a_byte_exact_prefix(runtime, prefix, matching, others):
    with runtime.sessions.begin() as session:
        for bucket in matching + others:
            session.execute(insert(RateWindow).values(bucket=bucket, window_start=0, used=1))
    with runtime.sessions() as session:
        assert sorted(session.scalars(select(RateWindow.bucket).where(starts_with(RateWindow.bucket, prefix)))) == \
            sorted(matching)


def test_ops_unlock_and_the_refusal_sweep_leave_buckets_differing_only_by_case_alone(runtime):
    """A host's own RateLimit('OPS-LOGIN:partner') or 'Files-Refused:...' is not the console's login
    throttle nor the download refusals' counter (SQLite's LIKE took them for those)."""
    from cronbox.cron.operator import throttle
    from cronbox.storage import refusals

    now = clock.utcnow()
    theirs = [RateLimit("OPS-LOGIN:partner", 5, 60), RateLimit("Files-Refused:partner", 5, 60)]
    with runtime.sessions.begin() as session:
        throttle.take(session, "203.0.113.9", now)
        for limit in theirs:
            limit.acquire(session, now)
        session.execute(insert(RateWindow).values(bucket="Files-Refused:x", window_start=60, used=refusals.RECORDED + 3))
        session.execute(insert(RateWindow).values(bucket="files-refused:x", window_start=60,
                                                  used=refusals.RECORDED + 3))
    with runtime.sessions.begin() as session:
        assert throttle.unlock(session) == 2  # the client's window and the overall one
        assert refusals.flush(session, now, batch=10) == 1
    assert _windows(runtime) == [
        ("Files-Refused:partner", 1), ("Files-Refused:x", refusals.RECORDED + 3), ("OPS-LOGIN:partner", 1),
        ("files-refused:x", refusals.RECORDED)]
