"""storage: sealed files, grants, per-token uses, audit trail

Revision ID: 0004_storage
Revises: 0003_ops
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0004_storage"
down_revision = "0003_ops"
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
FileId = sa.String(32)


def upgrade() -> None:
    op.create_table(
        "cronbox_files",
        sa.Column("id", FileId, nullable=False),
        sa.Column("owner", sa.String(191), nullable=False),
        sa.Column("algorithm", sa.String(24), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("wrapped_key", sa.LargeBinary(), nullable=False),
        sa.Column("meta", sa.LargeBinary(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sealed_size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("integrity_error", sa.String(255), nullable=True),
        sa.Column("checked_at", When, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_files")),
    )
    op.create_index(op.f("ix_cronbox_files_key_id_id"), "cronbox_files", ["key_id", "id"])
    op.create_index(op.f("ix_cronbox_files_owner"), "cronbox_files", ["owner"])

    op.create_table(
        "cronbox_grants",
        sa.Column("id", FileId, nullable=False),
        sa.Column("file_id", FileId, nullable=False),
        sa.Column("subject", sa.String(191), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("expires_at", When, nullable=False),
        sa.Column("max_uses", sa.Integer(), nullable=True),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("revoked_at", When, nullable=True),
        sa.ForeignKeyConstraint(["file_id"], ["cronbox_files.id"], name=op.f("fk_cronbox_grants_file_id_cronbox_files")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_grants")),
    )
    op.create_index(op.f("ix_cronbox_grants_file_id"), "cronbox_grants", ["file_id"])
    op.create_index(op.f("ix_cronbox_grants_expires_at"), "cronbox_grants", ["expires_at"])

    op.create_table(
        "cronbox_grant_uses",
        sa.Column("grant_id", FileId, nullable=False),
        sa.Column("jti_hash", sa.String(32), nullable=False),
        sa.Column("first_at", When, nullable=False),
        sa.Column("last_at", When, nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["grant_id"], ["cronbox_grants.id"],
                                name=op.f("fk_cronbox_grant_uses_grant_id_cronbox_grants")),
        sa.PrimaryKeyConstraint("grant_id", "jti_hash", name=op.f("pk_cronbox_grant_uses")),
    )

    op.create_table(
        "cronbox_file_audit",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("at", When, nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("file_id", FileId, nullable=True),
        sa.Column("grant_id", FileId, nullable=True),
        sa.Column("subject", sa.String(191), nullable=True),
        sa.Column("jti_hash", sa.String(32), nullable=True),
        sa.Column("range_start", sa.BigInteger(), nullable=True),
        sa.Column("range_end", sa.BigInteger(), nullable=True),
        sa.Column("bytes_sent", sa.BigInteger(), nullable=True),
        sa.Column("client_ip", sa.String(45), nullable=True),
        sa.Column("user_agent", sa.String(255), nullable=True),
        sa.Column("detail", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_file_audit")),
    )
    op.create_index(op.f("ix_cronbox_file_audit_at"), "cronbox_file_audit", ["at"])
    op.create_index(op.f("ix_cronbox_file_audit_file_id_at"), "cronbox_file_audit", ["file_id", "at"])


def downgrade() -> None:
    op.drop_table("cronbox_file_audit")
    op.drop_table("cronbox_grant_uses")
    op.drop_table("cronbox_grants")
    op.drop_table("cronbox_files")
