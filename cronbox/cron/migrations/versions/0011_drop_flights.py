"""drop flights: forwarded deliveries are ordinary leased delivery rows

Revision ID: 0011_drop_flights
Revises: 0010_identity_bytes
Create Date: 2026-12-03

0009 kept a forward target's fresh keyless deliveries out of the delivery table while they were
published (one `cronbox_flights` row per fan-out and target: the event ids, a claim token, a
lease). The relay now claims and acks forwarded deliveries as rows like every other consumer's, so
the table goes. A flight still in it at upgrade time (a tick published it and was killed, or runs
right now with the old code) is first written as the leased delivery rows it stands for: attempt 1,
its claim token and its lease, so once the lease runs out the claim takes them like any expired
lease, and the broker gets them again (the same message ids). A row that exists already is left
as it is. Downgrading makes the table again, empty.
"""
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0011_drop_flights"
down_revision = "0010_identity_bytes"
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# 0010 made the identity columns VARBINARY(4n) on MySQL/MariaDB.
Token = sa.String(32).with_variant(mysql.VARBINARY(128), "mysql", "mariadb")
Consumer = sa.String(191).with_variant(mysql.VARBINARY(764), "mysql", "mariadb")

# The tables as this migration reads and writes them.
flights = sa.table("cronbox_flights", sa.column("token", Token), sa.column("consumer", Consumer),
                   sa.column("event_ids", LongText), sa.column("lease_until", When))
events = sa.table("cronbox_events", sa.column("id", Id), sa.column("key", sa.String(191)),
                  sa.column("available_at", When))
deliveries = sa.table("cronbox_deliveries", sa.column("event_id", Id), sa.column("consumer", Consumer),
                      sa.column("key", sa.String(191)), sa.column("status", sa.String(16)),
                      sa.column("attempts", sa.Integer()), sa.column("next_attempt_at", When),
                      sa.column("created_at", When), sa.column("claim_token", Token),
                      sa.column("lease_until", When))


def _land(bind) -> None:
    """Each flight's deliveries as leased rows (those not already written), in the upgrade's transaction."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # cronbox stores naive UTC
    for token, consumer, event_ids, lease_until in bind.execute(
            sa.select(flights.c.token, flights.c.consumer, flights.c.event_ids, flights.c.lease_until)).all():
        ids = [int(i) for i in event_ids.split(",") if i]
        written = set(bind.execute(sa.select(deliveries.c.event_id).where(
            deliveries.c.consumer == consumer, deliveries.c.event_id.in_(ids))).scalars())
        rows = bind.execute(sa.select(events.c.id, events.c.key, events.c.available_at).where(
            events.c.id.in_([i for i in ids if i not in written]))).all()
        if rows:
            bind.execute(deliveries.insert(), [
                {"event_id": event_id, "consumer": consumer, "key": key, "status": "pending", "attempts": 1,
                 "next_attempt_at": available_at, "created_at": now, "claim_token": token,
                 "lease_until": lease_until}
                for event_id, key, available_at in rows])


def upgrade() -> None:
    _land(op.get_bind())
    op.drop_index(op.f("ix_cronbox_flights_lease_until"), table_name="cronbox_flights")
    op.drop_table("cronbox_flights")


def downgrade() -> None:
    op.create_table(
        "cronbox_flights",
        sa.Column("token", Token, nullable=False),
        sa.Column("consumer", Consumer, nullable=False),
        sa.Column("event_ids", LongText, nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("first_event_id", Id, nullable=False),
        sa.Column("last_event_id", Id, nullable=False),
        sa.Column("lease_until", When, nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.PrimaryKeyConstraint("token", "consumer", name=op.f("pk_cronbox_flights")),
    )
    op.create_index(op.f("ix_cronbox_flights_lease_until"), "cronbox_flights", ["lease_until"])
