"""Schema management through Alembic, configured in code (no alembic.ini to keep in sync).

`SCHEMA_HEAD` is the revision this code needs; tests/test_migrations.py checks it
is the migrations' head, so start-up can compare one string instead of loading
the whole script directory on every cron tick.
"""
from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from cronbox.outbox.core import sqlite_files
from cronbox.outbox.core.errors import SchemaError
from cronbox.outbox.core.settings import Settings

log = logging.getLogger("cronbox")

SCHEMA_HEAD = "0015_batches"
VERSION_TABLE = "cronbox_alembic_version"
# The scripts are package data of `cron`, whose schema module assembles every family's tables for them;
# named as a package resource (found in a checkout and in site-packages alike), not imported from here.
SCRIPT_LOCATION = "cronbox.cron:migrations"


def alembic_config(settings: Settings, connection=None):
    from alembic.config import Config  # imported here: a routine tick never needs Alembic (~100 ms)

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.set_main_option("sqlalchemy.url", settings.database_url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def current_revision(engine: Engine) -> str | None:
    try:
        with engine.connect() as connection:
            return connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    except DBAPIError as exc:
        if _is_missing_table(exc):
            return None
        raise


def _is_missing_table(exc: DBAPIError) -> bool:
    message = str(exc.orig).lower()
    return ("no such table" in message or "doesn't exist" in message or getattr(exc.orig, "args", [None])[0] == 1146
            or getattr(exc.orig, "sqlstate", None) == "42P01")  # PostgreSQL: undefined_table


def upgrade(settings: Settings, engine: Engine) -> tuple[str | None, str]:
    """Upgrade to head; returns (revision before, revision after). Caller holds the migrate lock."""
    from alembic import command

    before = current_revision(engine)
    with engine.begin() as connection:
        command.upgrade(alembic_config(settings, connection), "head")
    after = current_revision(engine)
    if after != SCHEMA_HEAD:  # the scripts found are not this code's (a broken install lost some)
        raise SchemaError(f"the migrations in {SCRIPT_LOCATION} end at {after or 'nothing'}, this code needs "
                          f"{SCHEMA_HEAD}: reinstall cronbox")
    if before != after:
        log.info("migrated schema from %s to %s", before or "empty", after)
    return before, after


def ensure_schema(settings: Settings, engine: Engine, lock_factory) -> None:
    """Fresh SQLite databases are migrated on first use; MySQL must be migrated on purpose.

    A SQLite database is also made private here, as `migrate` makes it (outbox.core.sqlite_files): a
    host app's file (0644 from Flask-SQLAlchemy) that only ever migrates this way, in a web process or
    a tick, would otherwise stay open to other accounts. Each file narrowed is logged; what is left
    open (another owner's file, the folder) is logged when this call migrated, not at every check."""
    revision = current_revision(engine)
    if engine.dialect.name != "sqlite":
        if revision == SCHEMA_HEAD:
            return
        if revision is None:
            raise SchemaError("the cronbox tables do not exist yet: run `python -m cronbox migrate`")
        raise SchemaError(f"the database schema is at {revision}, this code needs {SCHEMA_HEAD}: "
                          "run `python -m cronbox migrate`")
    migrated = False
    if revision != SCHEMA_HEAD:
        lock = lock_factory("migrate")
        if not lock.acquire():
            raise SchemaError("the database is being migrated by another process; try again in a moment")
        try:
            if current_revision(engine) != SCHEMA_HEAD:
                upgrade(settings, engine)
                migrated = True
        finally:
            lock.release()
    done, warnings = sqlite_files.make_private(settings.database_url)
    for line in done:
        log.warning("sqlite: %s", line)
    for line in warnings if migrated else []:
        log.warning("sqlite: %s", line)
