"""queue: jobs, in-app notifications, send attempts, rate windows, channel pauses

Revision ID: 0002_queue
Revises: 0001_outbox
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002_queue"
down_revision = "0001_outbox"
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "cronbox_jobs",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("queue", sa.String(64), nullable=False),
        sa.Column("handler", sa.String(191), nullable=False),
        sa.Column("payload", LongText, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("available_at", When, nullable=True),
        sa.Column("claim_token", sa.String(32), nullable=True),
        sa.Column("unique_key", sa.String(191), nullable=True),
        sa.Column("retry_until", When, nullable=True),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("reserved_at", When, nullable=True),
        sa.Column("finished_at", When, nullable=True),
        sa.Column("last_error", sa.String(1000), nullable=True),
        sa.Column("error_class", sa.String(191), nullable=True),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_jobs")),
        sa.UniqueConstraint("unique_key", name=op.f("uq_cronbox_jobs_unique_key")),
    )
    op.create_index(op.f("ix_cronbox_jobs_queue_status_available_at_id"), "cronbox_jobs",
                    ["queue", "status", "available_at", "id"])
    op.create_index(op.f("ix_cronbox_jobs_status_finished_at"), "cronbox_jobs", ["status", "finished_at"])

    op.create_table(
        "cronbox_notifications",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("recipient", sa.String(191), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("title", sa.String(255), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("data", sa.Text(), nullable=True),
        sa.Column("dedupe_key", sa.String(191), nullable=True),
        sa.Column("created_at", When, nullable=False),
        sa.Column("read_at", When, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_notifications")),
        sa.UniqueConstraint("dedupe_key", name=op.f("uq_cronbox_notifications_dedupe_key")),
    )
    op.create_index(op.f("ix_cronbox_notifications_created_at"), "cronbox_notifications", ["created_at"])
    op.create_index(op.f("ix_cronbox_notifications_recipient_read_at_id"), "cronbox_notifications",
                    ["recipient", "read_at", "id"])

    op.create_table(
        "cronbox_send_attempts",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("idempotency_key", sa.String(191), nullable=False),
        sa.Column("recipient_masked", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("provider_status", sa.String(64), nullable=True),
        sa.Column("provider_id", sa.String(191), nullable=True),
        sa.Column("detail", sa.String(500), nullable=True),
        sa.Column("created_at", When, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_send_attempts")),
    )
    op.create_index(op.f("ix_cronbox_send_attempts_created_at"), "cronbox_send_attempts", ["created_at"])
    op.create_index(op.f("ix_cronbox_send_attempts_idempotency_key"), "cronbox_send_attempts", ["idempotency_key"])

    op.create_table(
        "cronbox_rate_windows",
        sa.Column("bucket", sa.String(64), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("used", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("bucket", "window_start", name=op.f("pk_cronbox_rate_windows")),
    )
    op.create_table(
        "cronbox_channel_pauses",
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("paused_until", When, nullable=False),
        sa.Column("reason", sa.String(255), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.PrimaryKeyConstraint("channel", name=op.f("pk_cronbox_channel_pauses")),
    )


def downgrade() -> None:
    op.drop_table("cronbox_channel_pauses")
    op.drop_table("cronbox_rate_windows")
    op.drop_table("cronbox_send_attempts")
    op.drop_table("cronbox_notifications")
    op.drop_table("cronbox_jobs")
