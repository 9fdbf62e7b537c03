"""Alembic environment (from Alembic's generic template).

Our version table is `cronbox_alembic_version` and only `cronbox_*` tables are
ours: the host app shares the database and may have its own Alembic history.
"""
from alembic import context

from cronbox.cron.schema import is_cronbox_table, metadata
from cronbox.outbox.core.migrate import VERSION_TABLE

config = context.config
target_metadata = metadata


def include_name(name, type_, parent_names):
    """Only cronbox's own tables (the host's are the host's); the host's env.py uses the complement,
    `cronbox.alembic_include_name`."""
    if type_ == "table":
        return is_cronbox_table(name) and name != VERSION_TABLE
    return True


def _configure(**kwargs):
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        compare_type=True,
        **kwargs,
    )


def run_migrations_offline():
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online():
    connection = config.attributes["connection"]
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
