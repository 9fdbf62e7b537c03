"""sealed payloads: a seal id per event and job row, and this database's install id

Revision ID: 0014_sealed_payloads
Revises: 0013_payload_bytes
Create Date: 2026-12-08

A sealed payload (outbox.core.sealing, docs/sealed-format.md "Sealed payloads") is bound to its
row by a random `seal_id` written in the same INSERT (an id is only known after it), and to its
database by `cronbox_install`'s one row, a random id made here: an envelope copied to another row,
table or database does not open. Unique: two rows never share a seal id, so an envelope copied
with its seal id into a second row of its table is refused by the database too. Plaintext rows
keep NULL (NULLs never collide).
"""
import secrets
import sqlite3
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0014_sealed_payloads"
down_revision = "0013_payload_bytes"
branch_labels = None
depends_on = None

TABLES = ("cronbox_events", "cronbox_jobs")


def upgrade() -> None:
    # A unique index, not a constraint: both are added and dropped in place on SQLite, where a table
    # copy (batch mode) of cronbox_events is refused while deliveries reference it (foreign keys on).
    for name in TABLES:
        op.add_column(name, sa.Column("seal_id", sa.String(32), nullable=True))
        op.create_index(op.f(f"ix_{name}_seal_id"), name, ["seal_id"], unique=True)
    install = op.create_table(
        "cronbox_install",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("install_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb"),
                  nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_install")),
    )
    op.bulk_insert(install, [{"id": 1, "install_id": secrets.token_hex(16),
                              "created_at": datetime.now(timezone.utc).replace(tzinfo=None)}])


def downgrade() -> None:
    # As 0013's: in place, except on a SQLite older than 3.35 (batch mode: prune the events first there).
    op.drop_table("cronbox_install")
    in_place = op.get_bind().dialect.name != "sqlite" or sqlite3.sqlite_version_info >= (3, 35)
    for name in TABLES:
        op.drop_index(op.f(f"ix_{name}_seal_id"), table_name=name)
        if in_place:
            op.drop_column(name, "seal_id")
            continue
        with op.batch_alter_table(name) as batch:
            batch.drop_column("seal_id")
