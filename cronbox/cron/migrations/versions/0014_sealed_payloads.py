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
    for name in TABLES:
        with op.batch_alter_table(name) as batch:
            batch.add_column(sa.Column("seal_id", sa.String(32), nullable=True))
            batch.create_unique_constraint(op.f(f"uq_{name}_seal_id"), ["seal_id"])
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
    op.drop_table("cronbox_install")
    for name in TABLES:
        with op.batch_alter_table(name) as batch:
            batch.drop_constraint(op.f(f"uq_{name}_seal_id"), type_="unique")
            batch.drop_column("seal_id")
