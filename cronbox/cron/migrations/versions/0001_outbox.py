"""outbox: events, per-consumer deliveries, run heartbeats

Revision ID: 0001_outbox
Revises:
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001_outbox"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "cronbox_events",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("type", sa.String(191), nullable=False),
        sa.Column("key", sa.String(191), nullable=True),
        sa.Column("payload", LongText, nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("available_at", When, nullable=False),
        sa.Column("fanned_out_at", When, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_events")),
    )
    op.create_index(op.f("ix_cronbox_events_fanned_out_at_id"), "cronbox_events", ["fanned_out_at", "id"])

    op.create_table(
        "cronbox_deliveries",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("event_id", Id, nullable=False),
        sa.Column("consumer", sa.String(191), nullable=False),
        sa.Column("key", sa.String(191), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", When, nullable=False),
        sa.Column("claim_token", sa.String(32), nullable=True),
        sa.Column("lease_until", When, nullable=True),
        sa.Column("last_error", sa.String(1000), nullable=True),
        sa.Column("created_at", When, nullable=False),
        sa.Column("finished_at", When, nullable=True),
        sa.ForeignKeyConstraint(
            ["event_id"], ["cronbox_events.id"], name=op.f("fk_cronbox_deliveries_event_id_cronbox_events")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_deliveries")),
        sa.UniqueConstraint("event_id", "consumer", name=op.f("uq_cronbox_deliveries_event_id_consumer")),
    )
    op.create_index(
        op.f("ix_cronbox_deliveries_status_next_attempt_at_id"),
        "cronbox_deliveries",
        ["status", "next_attempt_at", "id"],
    )
    op.create_index(op.f("ix_cronbox_deliveries_status_lease_until"), "cronbox_deliveries", ["status", "lease_until"])
    op.create_index(
        op.f("ix_cronbox_deliveries_consumer_key_status_event_id"),
        "cronbox_deliveries",
        ["consumer", "key", "status", "event_id"],
    )

    op.create_table(
        "cronbox_heartbeats",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("command", sa.String(32), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", When, nullable=False),
        sa.Column("finished_at", When, nullable=True),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("delivered", sa.Integer(), nullable=False),
        sa.Column("retried", sa.Integer(), nullable=False),
        sa.Column("dead", sa.Integer(), nullable=False),
        sa.Column("jobs_done", sa.Integer(), nullable=False),
        sa.Column("jobs_failed", sa.Integer(), nullable=False),
        sa.Column("backlog", sa.Integer(), nullable=True),
        sa.Column("peak_rss_kb", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(1000), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_heartbeats")),
    )
    op.create_index(op.f("ix_cronbox_heartbeats_started_at"), "cronbox_heartbeats", ["started_at"])


def downgrade() -> None:
    op.drop_table("cronbox_heartbeats")
    op.drop_table("cronbox_deliveries")
    op.drop_table("cronbox_events")
