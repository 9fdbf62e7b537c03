import click

from cron.commands.base import runtime
from outbox.core.migrate import upgrade


@click.command()
@click.pass_context
def migrate(ctx):
    """Create or upgrade cronbox's tables (Alembic, under the migrate lock)."""
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
