"""`demo`: example paid appointments, for the README's "Try it".

cronbox.cron.demo is imported inside the command, never when this module loads: importing it registers
its two consumers, and every process builds the command tree (the host's `outbox status`, its
Flask app), where they would fan out each `appointment.paid` and die on the missing demo tables.
Its consumers exist only in a process that runs the demo or names it in CRONBOX_HANDLERS.
"""
from decimal import Decimal

import click

from cronbox.cron.commands.base import runtime
from cronbox.outbox.core.transactions import in_transaction


@click.command()
@click.option("--count", type=click.IntRange(min=1, max=10000), default=3, show_default=True,
              help="How many paid appointments to record.")
def demo(count):
    """Record example paid appointments (tables demo_*: payment + escrow written synchronously, events in the
    outbox)."""
    from cronbox.cron import demo as domain  # here, not at the top: see the module's docstring
    rt = runtime()
    domain.create_tables(rt.engine)
    for number in range(count):
        in_transaction(rt.sessions, lambda s: domain.pay_appointment(
            s, clinic=f"clinic-{number % 3 + 1}", amount=Decimal("120.00") + number))
    click.echo(f"demo: {count} paid appointments recorded; {count} appointment.paid events are in the outbox")
    if "cronbox.cron.demo" not in rt.settings.handlers:
        click.echo("note: CRONBOX_HANDLERS does not include cronbox.cron.demo, so a tick will not deliver them")
