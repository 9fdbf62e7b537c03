"""identity bytes: every column compared as an identity compares bytes on MySQL/MariaDB too

Revision ID: 0010_identity_bytes
Revises: 0009_flights
Create Date: 2026-12-02

The VARCHAR columns of 0001-0009 took the server's default collation, on MariaDB and MySQL 5.7
case- and accent-insensitive (`utf8mb4_general_ci`): the inbox key (consumer, message_id) took
'msg-a', 'MSG-A' and 'msg-á' for one message and the consumer never ran for the others. SQLite
compares TEXT byte for byte (BINARY collation) and is left as it is.

Why VARBINARY and not a `_bin` collation: the `_bin` collations PAD SPACE ('a' = 'a '); the NO
PAD binary ones are per server (MariaDB 10.2+ `utf8mb4_nopad_bin`, MySQL 8.0.17+
`utf8mb4_0900_bin`) and MySQL 5.7 has none. VARBINARY compares bytes, unpadded, on every server we
support. A column of n characters becomes VARBINARY(4n), so each value (its UTF-8 bytes, which is
what MODIFY converts utf8mb4 text to) still fits, and the longest key, 2 x 764 bytes, stays under
InnoDB's 3072-byte limit. The models say the same through `cronbox.outbox.core.models.ExactString`.

One ALTER per table (one table copy, indexes and keys kept), nullability as the database has it.
The two foreign keys between file and grant ids are dropped around it: MySQL refuses to change
the type of a column a foreign key uses. Upgrade and downgrade can be run again after a failure
part way (MySQL commits each ALTER): a column already converted is converted to what it is.
Downgrading fails on the server's duplicate-key error, changing nothing of that table, when
rows differ only by case, accent or trailing spaces: they are distinct messages, keys or jobs.
"""
import sqlalchemy as sa
from alembic import op

revision = "0010_identity_bytes"
down_revision = "0009_flights"
branch_labels = None
depends_on = None

# Frozen copy of the columns made ExactString in the models, with their length in characters.
IDENTITIES = {
    "cronbox_events": {"type": 191, "key": 191},
    "cronbox_deliveries": {"consumer": 191, "key": 191, "claim_token": 32},
    "cronbox_flights": {"token": 32, "consumer": 191},
    "cronbox_inbox": {"consumer": 191, "message_id": 191},
    "cronbox_redeliveries": {"queue": 191, "message_id": 191},
    "cronbox_jobs": {"queue": 64, "handler": 191, "claim_token": 32, "unique_key": 191,
                     "concurrency_group": 64},
    "cronbox_rate_windows": {"bucket": 64},
    "cronbox_channel_pauses": {"channel": 32},
    "cronbox_group_slots": {"group_name": 64, "holder": 64},
    "cronbox_heartbeats": {"command": 32, "host": 255, "detail": 191},
    "cronbox_handler_profiles": {"kind": 16, "handler": 191},
    "cronbox_schedule_runs": {"task": 191},
    "cronbox_alert_states": {"problem": 191},
    "cronbox_ops_sessions": {"id_hash": 64},
    "cronbox_notifications": {"recipient": 191, "dedupe_key": 191},
    "cronbox_send_attempts": {"channel": 32, "idempotency_key": 191},
    "cronbox_files": {"id": 32, "owner": 191, "key_id": 32},
    "cronbox_grants": {"id": 32, "file_id": 32, "subject": 191},
    "cronbox_grant_uses": {"grant_id": 32, "jti_hash": 32},
    "cronbox_file_audit": {"file_id": 32, "grant_id": 32, "subject": 191, "jti_hash": 32},
}

# (name, table, columns, referred table, referred columns), as 0004 made them.
FOREIGN_KEYS = [
    ("fk_cronbox_grants_file_id_cronbox_files", "cronbox_grants", ["file_id"], "cronbox_files", ["id"]),
    ("fk_cronbox_grant_uses_grant_id_cronbox_grants", "cronbox_grant_uses", ["grant_id"],
     "cronbox_grants", ["id"]),
]


def _foreign_keys_present(bind) -> set[str]:
    inspector = sa.inspect(bind)
    return {fk["name"] for _, table, *_ in FOREIGN_KEYS for fk in inspector.get_foreign_keys(table)}


def _to_utf8mb4(bind, table: str, columns: dict, nullable: dict) -> None:
    """Columns a database with another default character set (latin1, ...) gave its own: made
    utf8mb4 first, so that VARBINARY keeps the UTF-8 bytes cronbox reads back (MODIFY keeps the
    bytes of whatever character set the text was in). utf8/utf8mb3 text is UTF-8 already."""
    quote = bind.dialect.identifier_preparer.quote
    other = [name for name, charset in bind.execute(sa.text(
        "SELECT COLUMN_NAME, CHARACTER_SET_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :table"), {"table": table})
        if name in columns and charset and not charset.lower().startswith("utf8")]
    if other:
        op.execute(f"ALTER TABLE {quote(table)} " + ", ".join(
            f"MODIFY {quote(name)} VARCHAR({columns[name]}) CHARACTER SET utf8mb4 "
            f"{'NULL' if nullable[name] else 'NOT NULL'}" for name in other))


def _modify(bind, column_type, upgrading: bool) -> None:
    """One ALTER TABLE per table: every identity column to `column_type(length)`."""
    inspector = sa.inspect(bind)
    quote = bind.dialect.identifier_preparer.quote
    present = _foreign_keys_present(bind)
    for name, table, *_ in FOREIGN_KEYS:
        if name in present:
            op.drop_constraint(name, table, type_="foreignkey")
    for table, columns in IDENTITIES.items():
        nullable = {column["name"]: column["nullable"] for column in inspector.get_columns(table)}
        if upgrading:
            _to_utf8mb4(bind, table, columns, nullable)
        clauses = [f"MODIFY {quote(column)} {column_type(length)} {'NULL' if nullable[column] else 'NOT NULL'}"
                   for column, length in columns.items()]
        op.execute(f"ALTER TABLE {quote(table)} {', '.join(clauses)}")
    for name, table, columns, referred, referred_columns in FOREIGN_KEYS:
        op.create_foreign_key(name, table, referred, columns, referred_columns)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name in ("mysql", "mariadb"):
        _modify(bind, lambda length: f"VARBINARY({4 * length})", upgrading=True)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name in ("mysql", "mariadb"):
        # Back to the table's default character set and collation, as 0001-0009 created them.
        _modify(bind, lambda length: f"VARCHAR({length})", upgrading=False)
