"""console: operator sessions, operator action log, indexes for the console's filters and counts

Revision ID: 0005_console
Revises: 0004_storage
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0005_console"
down_revision = "0004_storage"
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "cronbox_ops_sessions",
        sa.Column("id_hash", sa.String(64), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("seen_at", When, nullable=False),
        sa.Column("expires_at", When, nullable=False),
        sa.Column("password_fingerprint", sa.String(16), nullable=False),
        sa.Column("client_ip", sa.String(45), nullable=True),
        sa.Column("user_agent", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_cronbox_ops_sessions")),
    )
    op.create_index(op.f("ix_cronbox_ops_sessions_expires_at"), "cronbox_ops_sessions", ["expires_at"])

    op.create_table(
        "cronbox_ops_actions",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("at", When, nullable=False),
        sa.Column("operator", sa.String(64), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(255), nullable=True),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("detail", sa.String(500), nullable=True),
        sa.Column("client_ip", sa.String(45), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_ops_actions")),
    )
    op.create_index(op.f("ix_cronbox_ops_actions_at"), "cronbox_ops_actions", ["at"])

    op.create_index(op.f("ix_cronbox_file_audit_file_id_id"), "cronbox_file_audit", ["file_id", "id"])
    op.create_index(op.f("ix_cronbox_file_audit_subject_id"), "cronbox_file_audit", ["subject", "id"])
    op.create_index(op.f("ix_cronbox_file_audit_outcome_id"), "cronbox_file_audit", ["outcome", "id"])
    op.create_index(op.f("ix_cronbox_grants_created_at"), "cronbox_grants", ["created_at"])
    op.create_index(op.f("ix_cronbox_deliveries_status_consumer_next_attempt_at"), "cronbox_deliveries",
                    ["status", "consumer", "next_attempt_at"])
    op.create_index(op.f("ix_cronbox_grants_subject_created_at"), "cronbox_grants", ["subject", "created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_cronbox_deliveries_status_consumer_next_attempt_at"), table_name="cronbox_deliveries")
    op.drop_index(op.f("ix_cronbox_grants_subject_created_at"), table_name="cronbox_grants")
    op.drop_index(op.f("ix_cronbox_grants_created_at"), table_name="cronbox_grants")
    op.drop_index(op.f("ix_cronbox_file_audit_outcome_id"), table_name="cronbox_file_audit")
    op.drop_index(op.f("ix_cronbox_file_audit_subject_id"), table_name="cronbox_file_audit")
    op.drop_index(op.f("ix_cronbox_file_audit_file_id_id"), table_name="cronbox_file_audit")
    op.drop_index(op.f("ix_cronbox_ops_actions_at"), table_name="cronbox_ops_actions")
    op.drop_table("cronbox_ops_actions")
    op.drop_index(op.f("ix_cronbox_ops_sessions_expires_at"), table_name="cronbox_ops_sessions")
    op.drop_table("cronbox_ops_sessions")
