"""The clinic's Alembic environment: its own tables, on the app's database (create_app's DATABASE_URL).

`alembic_include_name` from cronbox keeps cronbox's tables (all cronbox_*) out of the comparison, so
`alembic revision --autogenerate` and `alembic check` never propose to drop or alter them.
"""
from logging.config import fileConfig

from alembic import context

from clinic import create_app
from clinic.models import db
from cronbox import alembic_include_name  # leaves every cronbox_* table to cronbox

if context.config.config_file_name is not None and context.config.attributes.get("configure_logger", True):
    fileConfig(context.config.config_file_name)

app = create_app()
with app.app_context():
    target_metadata = db.metadata
    engine = db.engine

if context.is_offline_mode():
    context.configure(url=engine.url.render_as_string(hide_password=False), target_metadata=target_metadata,
                      include_name=alembic_include_name, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=target_metadata, include_name=alembic_include_name)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()
