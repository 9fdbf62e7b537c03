"""payload_bytes: each event's, delivery's and job's payload size, for claims bounded by bytes

Revision ID: 0013_payload_bytes
Revises: 0012_postgresql
Create Date: 2026-12-06

A claim takes due rows up to a batch count and, since this revision, up to a sum of payload bytes
(outbox.engine.claim): a backlog of large payloads is claimed a few at a time instead of a
hundred payloads read into the run at once. The size is a column written with the payload
(record(), dispatch(); a delivery copies its event's at fan-out), because computing it in the
claim would read the payload after all: MySQL's LENGTH() fetches the whole LONGTEXT from InnoDB,
and SQLite's length() walks the text to count characters.

Nullable: a process still running the code before this revision (a web process not yet
restarted) writes rows without it, and the claim counts an unknown size as nothing, as before.
The rows that can still be claimed get their size here: events not yet fanned out, deliveries
pending or dead (an operator may retry those), jobs ready, reserved or failed. Finished rows keep
NULL; nothing claims them again.
"""
import sqlite3

import sqlalchemy as sa
from alembic import op

revision = "0013_payload_bytes"
down_revision = "0012_postgresql"
branch_labels = None
depends_on = None

TABLES = ("cronbox_events", "cronbox_deliveries", "cronbox_jobs")


def _bytes_of(column: str) -> str:
    """SQL for the UTF-8 size of a text column: LENGTH() counts bytes on MySQL/MariaDB but
    characters on SQLite and PostgreSQL (octet_length() exists on SQLite only from 3.43)."""
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        return f"length(CAST({column} AS BLOB))"
    if dialect == "postgresql":
        return f"octet_length({column})"
    return f"LENGTH({column})"


def upgrade() -> None:
    for name in TABLES:
        with op.batch_alter_table(name) as batch:
            batch.add_column(sa.Column("payload_bytes", sa.Integer(), nullable=True))
    op.execute(f"UPDATE cronbox_events SET payload_bytes = {_bytes_of('payload')} WHERE fanned_out_at IS NULL")
    op.execute("UPDATE cronbox_deliveries SET payload_bytes = (SELECT "
               f"{_bytes_of('cronbox_events.payload')} FROM cronbox_events "
               "WHERE cronbox_events.id = cronbox_deliveries.event_id) WHERE status IN ('pending', 'dead')")
    op.execute(f"UPDATE cronbox_jobs SET payload_bytes = {_bytes_of('payload')} "
               "WHERE status IN ('ready', 'reserved', 'failed')")


def downgrade() -> None:
    # SQLite drops a column in place since 3.35. Before that Alembic copies the table (batch mode),
    # which SQLite refuses for cronbox_events while a delivery row references it (foreign keys
    # are on): on such an old SQLite, downgrade an outbox whose events were pruned.
    in_place = op.get_bind().dialect.name != "sqlite" or sqlite3.sqlite_version_info >= (3, 35)
    for name in TABLES:
        if in_place:
            op.drop_column(name, "payload_bytes")
            continue
        with op.batch_alter_table(name) as batch:
            batch.drop_column("payload_bytes")
