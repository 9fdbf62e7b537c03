from decimal import Decimal

import click

from cron import demo as domain
from cron.commands.base import runtime
from outbox.core.db import in_transaction


@click.command()
@click.option("--count", type=click.IntRange(min=1, max=10000), default=3, show_default=True)
def demo(count):
    """Record example paid appointments (payment + escrow written synchronously, events in the outbox)."""
    rt = runtime()
    domain.create_tables(rt.engine)
    for number in range(count):
        in_transaction(rt.sessions, lambda s: domain.pay_appointment(
            s, clinic=f"clinic-{number % 3 + 1}", amount=Decimal("120.00") + number))
    click.echo(f"demo: {count} paid appointments recorded; {count} appointment.paid events are in the outbox")
    if "cron.demo" not in rt.settings.handlers:
        click.echo("note: CRONBOX_HANDLERS does not include cron.demo, so a tick will not deliver them")
