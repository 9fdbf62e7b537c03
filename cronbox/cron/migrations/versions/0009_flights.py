"""flights: a forward target's fresh keyless deliveries published and not yet settled

Revision ID: 0009_flights
Revises: 0008_redeliveries
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0009_flights"
down_revision = "0008_redeliveries"
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "cronbox_flights",
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("consumer", sa.String(191), nullable=False),
        sa.Column("event_ids", LongText, nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("first_event_id", Id, nullable=False),
        sa.Column("last_event_id", Id, nullable=False),
        sa.Column("lease_until", When, nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.PrimaryKeyConstraint("token", "consumer", name=op.f("pk_cronbox_flights")),
    )
    op.create_index(op.f("ix_cronbox_flights_lease_until"), "cronbox_flights", ["lease_until"])


def downgrade() -> None:
    op.drop_index(op.f("ix_cronbox_flights_lease_until"), table_name="cronbox_flights")
    op.drop_table("cronbox_flights")
