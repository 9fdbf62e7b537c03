import click

from cronbox.cron.commands.base import runtime
from cronbox.outbox.core import sqlite_files
from cronbox.outbox.core.migrate import upgrade


@click.command()
@click.pass_context
def migrate(ctx):
    """Create or upgrade cronbox's tables (Alembic, under the migrate lock); on SQLite, make the
    database file private (0600) when it is yours and others may read it."""
    rt = runtime(migrate=False)
    lock = rt.lock("migrate")
    if not lock.acquire():
        click.echo("skipped: migrate already running")
        return
    try:
        before, after = upgrade(rt.settings, rt.engine)
    finally:
        lock.release()
    if before == after:
        click.echo(f"migrate: already at {after}")
    else:
        click.echo(f"migrate: {before or 'empty'} -> {after}")
    _narrow_database(rt.settings.database_url)


def _narrow_database(url: str) -> None:
    """A host app's SQLite file is made 0644 by Flask-SQLAlchemy: cronbox's tables in it hold job
    payloads. Narrowed when this user owns it; another owner's file is left to them, with a warning."""
    done, warnings = sqlite_files.make_private(url)
    for line in done:
        click.echo(f"migrate: {line}")
    for line in warnings:
        click.echo(f"warning: {line}", err=True)
