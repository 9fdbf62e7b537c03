"""batches: batches of jobs, chains, results and idempotency keys (issue 39)

Revision ID: 0015_batches
Revises: 0014_sealed_payloads
Create Date: 2026-12-08

1. `cronbox_jobs` gains `batch_id` (the batch a job is a member of; indexed with its status, so a
   batch's pending members are one index range), `flow` (JSON: a chain's rest, or which batch's
   callback the job is; NULL for nearly every job), and `idempotency_key` / `idempotency_until`
   (dispatch(idempotency_key=): the same key returns the same job until then).
2. `cronbox_batches`: a batch's callbacks and the counters of its members' final outcomes.
3. `cronbox_job_results`: a job's return value, written with its done, kept CRONBOX_RESULT_TTL.

Every new column is nullable: a process still running the code before this revision writes jobs
without them, as plain jobs. (Rechained on the sealed payloads' 0014 at their merge.)
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0015_batches"
down_revision = "0014_sealed_payloads"
branch_labels = None
depends_on = None

# Frozen copies of the model types (a migration must not change when models do).
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
When = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def _exact(length: int):
    """cronbox.outbox.core.models.ExactString as migrations 0010 and 0012 made it."""
    return (sa.String(length).with_variant(mysql.VARBINARY(4 * length), "mysql", "mariadb")
            .with_variant(sa.String(length, collation="C"), "postgresql"))


def upgrade() -> None:
    with op.batch_alter_table("cronbox_jobs") as batch:
        batch.add_column(sa.Column("batch_id", Id, nullable=True))
        batch.add_column(sa.Column("flow", LongText, nullable=True))
        batch.add_column(sa.Column("idempotency_key", _exact(191), nullable=True))
        batch.add_column(sa.Column("idempotency_until", When, nullable=True))
        batch.create_unique_constraint(op.f("uq_cronbox_jobs_idempotency_key"), ["idempotency_key"])
        batch.create_index(op.f("ix_cronbox_jobs_batch_id_status"), ["batch_id", "status"])
    op.create_table(
        "cronbox_batches",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(191), nullable=False),
        sa.Column("callbacks", sa.Text(), nullable=False),
        sa.Column("payload", LongText, nullable=False),
        sa.Column("allow_failures", sa.Boolean(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("cancelled", sa.Integer(), nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("created_at", When, nullable=False),
        sa.Column("failed_at", When, nullable=True),
        sa.Column("cancelled_at", When, nullable=True),
        sa.Column("finished_at", When, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cronbox_batches")),
    )
    op.create_index(op.f("ix_cronbox_batches_finished_at"), "cronbox_batches", ["finished_at"])
    op.create_table(
        "cronbox_job_results",
        sa.Column("job_id", Id, autoincrement=False, nullable=False),
        sa.Column("batch_id", Id, nullable=True),
        sa.Column("value", LongText, nullable=False),
        sa.Column("expires_at", When, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_cronbox_job_results")),
    )
    op.create_index(op.f("ix_cronbox_job_results_batch_id_job_id"), "cronbox_job_results", ["batch_id", "job_id"])
    op.create_index(op.f("ix_cronbox_job_results_expires_at"), "cronbox_job_results", ["expires_at"])


def downgrade() -> None:
    op.drop_table("cronbox_job_results")
    op.drop_table("cronbox_batches")
    with op.batch_alter_table("cronbox_jobs") as batch:
        batch.drop_index(op.f("ix_cronbox_jobs_batch_id_status"))
        batch.drop_constraint(op.f("uq_cronbox_jobs_idempotency_key"), type_="unique")
        for column in ("idempotency_until", "idempotency_key", "flow", "batch_id"):
            batch.drop_column(column)
