"""inbox: messages a broker consumer has handled, and a beat on every long-running run's heartbeat

Revision ID: 0006_inbox
Revises: 0005_console
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0006_inbox"
down_revision = "0005_console"
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    # (consumer, message_id) is the primary key: 2 x 191 utf8mb4 characters fit InnoDB's 3072-byte
    # key limit (DYNAMIC rows, the default from MariaDB 10.2 / MySQL 5.7.9).
    op.create_table(
        "cronbox_inbox",
        sa.Column("consumer", sa.String(191), nullable=False),
        sa.Column("message_id", sa.String(191), nullable=False),
        sa.Column("event_type", sa.String(191), nullable=False),
        sa.Column("trace_id", sa.String(64), nullable=True),
        sa.Column("received_at", When, nullable=False),
        sa.PrimaryKeyConstraint("consumer", "message_id", name=op.f("pk_cronbox_inbox")),
    )
    op.create_index(op.f("ix_cronbox_inbox_received_at"), "cronbox_inbox", ["received_at"])
    with op.batch_alter_table("cronbox_heartbeats") as batch:
        batch.add_column(sa.Column("beat_at", When, nullable=True))
        batch.add_column(sa.Column("detail", sa.String(191), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cronbox_heartbeats") as batch:
        batch.drop_column("detail")
        batch.drop_column("beat_at")
    op.drop_index(op.f("ix_cronbox_inbox_received_at"), table_name="cronbox_inbox")
    op.drop_table("cronbox_inbox")
