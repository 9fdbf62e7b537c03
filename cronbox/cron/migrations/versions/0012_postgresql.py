"""postgresql: identity columns compared and ordered by bytes, and a NOTIFY when events or jobs arrive

Revision ID: 0012_postgresql
Revises: 0011_drop_flights
Create Date: 2026-12-03

PostgreSQL only; nothing changes on SQLite or MySQL/MariaDB.

1. The identity columns (cronbox.outbox.core.models.ExactString) get `COLLATE "C"`: PostgreSQL's
   deterministic collations already call two strings equal only when their bytes are, but order
   them by language rules, and cronbox reads key ranges of them (outbox.core.sql.starts_with).
2. `cronbox_notify()`, a statement-level AFTER INSERT trigger on cronbox_events and cronbox_jobs:
   `pg_notify('cronbox', table name)` in the inserting transaction, so a listener (a lingering tick
   or worker: outbox.core.notify) hears of new work when, and only when, it commits. One
   notification per statement, and PostgreSQL folds equal ones of a transaction into one.
"""
from alembic import op

revision = "0012_postgresql"
down_revision = "0011_drop_flights"
branch_labels = None
depends_on = None

# Frozen: (table, column, length) of every identity column at this revision.
IDENTITY_COLUMNS = [
    ("cronbox_alert_states", "problem", 191), ("cronbox_channel_pauses", "channel", 32),
    ("cronbox_deliveries", "consumer", 191), ("cronbox_deliveries", "key", 191),
    ("cronbox_deliveries", "claim_token", 32), ("cronbox_events", "type", 191), ("cronbox_events", "key", 191),
    ("cronbox_file_audit", "file_id", 32), ("cronbox_file_audit", "grant_id", 32),
    ("cronbox_file_audit", "subject", 191), ("cronbox_file_audit", "jti_hash", 32),
    ("cronbox_files", "id", 32), ("cronbox_files", "owner", 191), ("cronbox_files", "key_id", 32),
    ("cronbox_grant_uses", "grant_id", 32), ("cronbox_grant_uses", "jti_hash", 32),
    ("cronbox_grants", "id", 32), ("cronbox_grants", "file_id", 32), ("cronbox_grants", "subject", 191),
    ("cronbox_group_slots", "group_name", 64), ("cronbox_group_slots", "holder", 64),
    ("cronbox_handler_profiles", "kind", 16), ("cronbox_handler_profiles", "handler", 191),
    ("cronbox_heartbeats", "command", 32), ("cronbox_heartbeats", "host", 255), ("cronbox_heartbeats", "detail", 191),
    ("cronbox_inbox", "consumer", 191), ("cronbox_inbox", "message_id", 191),
    ("cronbox_jobs", "queue", 64), ("cronbox_jobs", "handler", 191), ("cronbox_jobs", "claim_token", 32),
    ("cronbox_jobs", "unique_key", 191), ("cronbox_jobs", "concurrency_group", 64),
    ("cronbox_notifications", "recipient", 191), ("cronbox_notifications", "dedupe_key", 191),
    ("cronbox_ops_sessions", "id_hash", 64), ("cronbox_rate_windows", "bucket", 64),
    ("cronbox_redeliveries", "queue", 191), ("cronbox_redeliveries", "message_id", 191),
    ("cronbox_schedule_runs", "task", 191),
    ("cronbox_send_attempts", "channel", 32), ("cronbox_send_attempts", "idempotency_key", 191),
]
NOTIFIED = ("cronbox_events", "cronbox_jobs")


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _collate(collation: str | None) -> None:
    for table, column, length in IDENTITY_COLUMNS:
        clause = f' COLLATE "{collation}"' if collation else ""
        op.execute(f'ALTER TABLE {table} ALTER COLUMN "{column}" TYPE VARCHAR({length}){clause}')


def upgrade():
    if not _postgresql():
        return
    _collate("C")
    op.execute("CREATE FUNCTION cronbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$ "
               "BEGIN PERFORM pg_notify('cronbox', TG_TABLE_NAME); RETURN NULL; END $$")
    for table in NOTIFIED:
        op.execute(f"CREATE TRIGGER {table}_notify AFTER INSERT ON {table} "
                   "FOR EACH STATEMENT EXECUTE FUNCTION cronbox_notify()")


def downgrade():
    if not _postgresql():
        return
    for table in NOTIFIED:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_notify ON {table}")
    op.execute("DROP FUNCTION IF EXISTS cronbox_notify()")
    _collate("default")
