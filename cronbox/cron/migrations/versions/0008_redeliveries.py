"""redeliveries: the kill count of a message `amqp consume --ordered` holds in place

Revision ID: 0008_redeliveries
Revises: 0007_admission
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0008_redeliveries"
down_revision = "0007_admission"
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    # (queue, message_id): 2 x 191 utf8mb4 characters, as cronbox_inbox's key.
    op.create_table(
        "cronbox_redeliveries",
        sa.Column("queue", sa.String(191), nullable=False),
        sa.Column("message_id", sa.String(191), nullable=False),
        sa.Column("times", sa.Integer(), nullable=False),
        sa.Column("seen_at", When, nullable=False),
        sa.PrimaryKeyConstraint("queue", "message_id", name=op.f("pk_cronbox_redeliveries")),
    )
    op.create_index(op.f("ix_cronbox_redeliveries_seen_at"), "cronbox_redeliveries", ["seen_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_cronbox_redeliveries_seen_at"), table_name="cronbox_redeliveries")
    op.drop_table("cronbox_redeliveries")
