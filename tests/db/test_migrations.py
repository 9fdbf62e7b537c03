"""Models and migrations agree; the schema head constant is the real head; first-use migration."""
from __future__ import annotations

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from outbox.core.errors import SchemaError
from outbox.core.migrate import SCHEMA_HEAD, VERSION_TABLE, alembic_config, current_revision
from outbox.engine.runtime import Runtime
from tests.conftest import ONE_MYSQL_MODE

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode changes nothing these tests check


def test_schema_head_constant_is_the_migrations_head(settings):
    assert ScriptDirectory.from_config(alembic_config(settings)).get_heads() == [SCHEMA_HEAD]


def test_models_and_migrations_agree(runtime):
    with runtime.engine.begin() as connection:
        command.check(alembic_config(runtime.settings, connection))  # raises if autogenerate finds a diff


def test_only_prefixed_tables(runtime):
    tables = set(inspect(runtime.engine).get_table_names())
    assert VERSION_TABLE in tables
    assert all(name.startswith("cronbox_") for name in tables)


def test_downgrade_to_empty_and_back(runtime):
    with runtime.engine.begin() as connection:
        command.downgrade(alembic_config(runtime.settings, connection), "base")
    assert current_revision(runtime.engine) is None
    with runtime.engine.begin() as connection:
        command.upgrade(alembic_config(runtime.settings, connection), "head")
    assert current_revision(runtime.engine) == SCHEMA_HEAD


def test_fresh_database_on_first_use(settings, database):
    runtime = Runtime(settings)
    try:
        if database.is_mysql:
            with pytest.raises(SchemaError, match="run `python -m cron migrate`"):
                runtime.ensure_schema()
        else:
            runtime.ensure_schema()  # SQLite: migrated automatically
            assert current_revision(runtime.engine) == SCHEMA_HEAD
    finally:
        runtime.dispose()
