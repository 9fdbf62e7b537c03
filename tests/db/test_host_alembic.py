"""The host app's own Alembic, in a database cronbox shares: its autogenerate must leave cronbox's tables alone.

docs/howto/alembic.md's env.py lines run as written (with a stand-in for alembic.context that keeps
what they configure), then Alembic compares the host's metadata with a database holding cronbox's tables.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Column, Integer, MetaData, String, Table, inspect

from cronbox.cron import schema
from tests.conftest import ONE_MYSQL_MODE
from tests.docs_snippets import snippet

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)


def host_metadata() -> MetaData:
    metadata = MetaData()
    Table("clinic_patients", metadata, Column("id", Integer, primary_key=True), Column("ref", String(32)))
    return metadata


def readme_env_py(connection, target_metadata) -> dict:
    """What docs/howto/alembic.md's env.py lines pass to context.configure()."""
    code = snippet("docs/howto/alembic.md", "context.configure(")
    configured: dict = {}
    context = SimpleNamespace(configure=lambda **options: configured.update(options))
    exec(compile(code, "docs/howto/alembic.md", "exec"),
         {"context": context, "connection": connection, "target_metadata": target_metadata})
    return configured


def table_names(diffs) -> set[str]:
    """Every table named by a proposed change: ("add_table", Table), ("add_column", schema, table, Column),
    [("modify_type", schema, table, column, ...)], ("add_index", Index), ("remove_fk", constraint), ..."""
    names = set()
    for diff in diffs:
        for change in diff if isinstance(diff, list) else [diff]:
            op = change[0]
            if op in ("add_column", "remove_column") or op.startswith("modify_"):
                names.add(change[2])
            else:
                names.add(change[1].name if isinstance(change[1], Table) else change[1].table.name)
    return names


def proposed(connection, metadata, **options) -> set[str]:
    context = MigrationContext.configure(connection, opts={"target_metadata": metadata, **options})
    return table_names(compare_metadata(context, metadata))


def test_the_hosts_autogenerate_proposes_nothing_for_cronbox_tables(runtime):
    metadata = host_metadata()
    with runtime.engine.connect() as connection:
        in_database = set(inspect(connection).get_table_names())
        assert set(schema.metadata.tables) | {"cronbox_alembic_version"} <= in_database

        unfiltered = proposed(connection, metadata)
        assert "cronbox_events" in unfiltered and "cronbox_alembic_version" in unfiltered  # what the issue saw

        options = readme_env_py(connection, metadata)
        assert options["connection"] is connection and options["target_metadata"] is metadata
        del options["connection"], options["target_metadata"]
        assert proposed(connection, metadata, **options) == {"clinic_patients"}  # the comparison ran

        assert proposed(connection, metadata, include_object=schema.include_object) == {"clinic_patients"}


def test_the_filter_also_drops_cronbox_tables_a_host_metadata_carries(runtime):
    """A host that imported cronbox's models onto its own metadata (or shares its Base) is not offered
    to create or alter them either: they are migrated by `python -m cronbox migrate`."""
    metadata = host_metadata()
    for table in schema.metadata.tables.values():
        table.to_metadata(metadata)
    Table("cronbox_from_elsewhere", metadata, Column("id", Integer, primary_key=True))
    with runtime.engine.connect() as connection:
        assert "cronbox_from_elsewhere" in proposed(connection, metadata)
        assert proposed(connection, metadata, include_object=schema.include_object) == {"clinic_patients"}
