"""The clinic's Alembic and cronbox's migrations share one database: the clinic's env.py filters cronbox's
tables out with cron.schema.include_name, so `alembic check` (autogenerate's comparison) finds nothing to
do although every cronbox_* table is there, and the clinic's models match its migration."""
from __future__ import annotations

import subprocess
import sys

from sqlalchemy import create_engine, inspect

from conftest import EXAMPLE_ROOT


def test_alembic_check_leaves_cronbox_tables_alone(migrated, clinic_env, tmp_path):
    engine = create_engine(clinic_env["DATABASE_URL"])
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"cronbox_events", "cronbox_jobs", "cronbox_files", "cronbox_alembic_version"} <= tables
    assert {"clinic_patients", "clinic_appointments", "clinic_payments", "clinic_receipts", "alembic_version"} <= tables

    done = subprocess.run([sys.executable, "-m", "alembic", "-c", str(EXAMPLE_ROOT / "alembic.ini"), "check"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No new upgrade operations detected" in done.stdout
