"""operations: scheduler slot runs, one-off run requests, alert state

Revision ID: 0003_ops
Revises: 0002_queue
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003_ops"
down_revision = "0002_queue"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "cronbox_schedule_runs",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("task", sa.String(191), nullable=False),
        sa.Column("slot", When, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", When, nullable=False),
        sa.Column("finished_at", When, nullable=True),
        sa.Column("error", sa.String(1000), nullable=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_schedule_runs")),
        sa.UniqueConstraint("task", "slot", name=op.f("uq_cronbox_schedule_runs_task_slot")),
    )
    op.create_index(op.f("ix_cronbox_schedule_runs_started_at"), "cronbox_schedule_runs", ["started_at"])
    op.create_table(
        "cronbox_once_requests",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("argv", sa.Text(), nullable=False),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(500), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("output", LongText, nullable=True),
        sa.Column("requested_at", When, nullable=False),
        sa.Column("started_at", When, nullable=True),
        sa.Column("finished_at", When, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_once_requests")),
    )
    op.create_index(op.f("ix_cronbox_once_requests_status_id"), "cronbox_once_requests", ["status", "id"])
    op.create_index(op.f("ix_cronbox_once_requests_requested_at"), "cronbox_once_requests", ["requested_at"])
    op.create_table(
        "cronbox_alert_states",
        sa.Column("problem", sa.String(191), nullable=False),
        sa.Column("failing", sa.Boolean(), nullable=False),
        sa.Column("detail", sa.String(500), nullable=True),
        sa.Column("since", When, nullable=False),
        sa.Column("last_alerted_at", When, nullable=True),
        sa.PrimaryKeyConstraint("problem", name=op.f("pk_cronbox_alert_states")),
    )


def downgrade() -> None:
    op.drop_table("cronbox_alert_states")
    op.drop_table("cronbox_once_requests")
    op.drop_table("cronbox_schedule_runs")
