"""`health [--json]`: the checks a monitor or the operator reads; exit 1 when one fails."""
from __future__ import annotations

import json

import click

from cronbox.cron.commands.base import runtime
from cronbox.cron.format import table
from cronbox.cron.scheduling.health import FAIL, run_checks


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
@click.pass_context
def health(ctx, as_json):
    """Check the database, the tick's age, backlogs, dead and failed counts, the `amqp consume` and `amqp work`
    runs per queue (fail: stopped beating, e.g. killed; warn: ended with an error), disk, memory headroom,
    key and folder permissions (each failing path named with the chmod that fixes it); exit 1 when
    something fails."""
    report = run_checks(runtime(migrate=False))
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        click.echo(table(["check", "status", "detail"], [[c.name, c.status, c.detail] for c in report.checks]))
        click.echo(f"health: {report.status}")
    ctx.exit(1 if report.status == FAIL else 0)
