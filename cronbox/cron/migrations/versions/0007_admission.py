"""admission: concurrency-group slots, handler profiles, and a job's own group and cost

Revision ID: 0007_admission
Revises: 0006_inbox
Create Date: 2026-12-01
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0007_admission"
down_revision = "0006_inbox"
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
Long = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    # A dispatch may override its handler's group and cost; NULL means "the handler's own".
    with op.batch_alter_table("cronbox_jobs") as batch:
        batch.add_column(sa.Column("concurrency_group", sa.String(64), nullable=True))
        batch.add_column(sa.Column("cost", sa.Integer(), nullable=True))
    # One row per slot of a concurrency group (slot 0 .. limit-1). A slot is taken by a guarded
    # UPDATE of its own row; it is free when holder is NULL or its lease has run out, so a killed
    # holder's slot frees itself and never leaks.
    op.create_table(
        "cronbox_group_slots",
        sa.Column("group_name", sa.String(64), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(64), nullable=True),
        sa.Column("lease_until", When, nullable=True),
        sa.Column("taken_at", When, nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("group_name", "slot", name=op.f("pk_cronbox_group_slots")),
    )
    # A recent profile per handler (kind: job / delivery): duration and the worker's RSS growth
    # while it ran, over a window, for admission; never_fits says why no run could take it.
    op.create_table(
        "cronbox_handler_profiles",
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("handler", sa.String(191), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("rss_growth_kb", sa.Integer(), nullable=False),
        sa.Column("samples", Long, nullable=False),
        sa.Column("updated_at", When, nullable=False),
        sa.Column("never_fits", sa.String(255), nullable=True),
        sa.Column("never_fits_at", When, nullable=True),
        sa.PrimaryKeyConstraint("kind", "handler", name=op.f("pk_cronbox_handler_profiles")),
    )


def downgrade() -> None:
    op.drop_table("cronbox_handler_profiles")
    op.drop_table("cronbox_group_slots")
    with op.batch_alter_table("cronbox_jobs") as batch:
        batch.drop_column("cost")
        batch.drop_column("concurrency_group")
