"""`schedule list` and `schedule run NAME`: the periodic tasks the tick runs."""
from __future__ import annotations

import click

from cronbox.cron.commands.base import CommandGroup, runtime
from cronbox.cron.format import table
from cronbox.cron.scheduling import builtin  # noqa: F401  (registers the built-in tasks)
from cronbox.cron.scheduling import schedule as scheduler
from cronbox.outbox.core import clock


@click.group(cls=CommandGroup)
def schedule():
    """Periodic tasks run by the tick, each at most once per slot."""


@schedule.command("list")
def schedule_list():
    """Tasks with their schedule, last run, next due and last error."""
    rt = runtime()
    now = clock.utcnow()
    rows = [[s.task.name, s.task.describe(), f"{s.last_slot:%Y-%m-%d %H:%M} {s.last_status}" if s.last_slot else "never",
             f"{s.next_due:%Y-%m-%d %H:%M}" + (" (due)" if s.next_due <= now else ""), (s.last_error or "")[:60]]
            for s in scheduler.status(rt)]
    click.echo(table(["task", "schedule", "last run (UTC)", "next due (UTC)", "last error"], rows) if rows
               else "no scheduled tasks")


@schedule.command("run")
@click.argument("name")
@click.pass_context
def schedule_run(ctx, name):
    """Run one task now (its own slot: a scheduled run of the current slot still happens)."""
    rt = runtime()
    task = rt.registry.tasks.get(name)
    if task is None:
        known = ", ".join(t.name for t in rt.registry.tasks.all()) or "none"
        raise click.UsageError(f"no task named {name!r} (known: {known})")
    lock = rt.lock("schedule-run")
    if not lock.acquire():
        click.echo("skipped: schedule run already running")
        return
    try:
        status = scheduler.run_task(rt, task, clock.utcnow())
    finally:
        lock.release()
    click.echo(f"schedule run {name}: {status}")
    ctx.exit(0 if status == "ok" else 1)
