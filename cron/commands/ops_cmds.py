"""`schedule ...`, `once ...` and `health`: operating cronbox with only cron lines and a browser."""
from __future__ import annotations

import json

import click
from sqlalchemy import select

from cron.cli import cli, group, runtime
from cron.format import age, table
from cron.scheduling import builtin  # noqa: F401  (registers the built-in tasks)
from cron.scheduling import once as once_requests
from cron.scheduling import schedule as scheduler
from cron.scheduling.health import FAIL, run_checks
from cron.scheduling.models import OnceRequest
from outbox.core import clock
from outbox.core.db import in_transaction

schedule = group("schedule", "Periodic tasks run by the tick, each at most once per slot.")
once = group("once", "One-off runs of allow-listed commands, asked for without SSH.")


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
    task = scheduler.TASKS.get(name)
    if task is None:
        known = ", ".join(t.name for t in scheduler.TASKS.all()) or "none"
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


@once.command("add", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def once_add(command):
    """Ask for a one-off run at the next tick, e.g. `once add migrate` or `once add queue retry --all`."""
    argv = list(command)
    reason = once_requests.allowed(argv)
    if reason:
        raise click.UsageError(reason)
    rt = runtime()
    request = in_transaction(rt.sessions, lambda s: once_requests.add(s, argv, source="cli"))
    click.echo(f"once: request {request.id} pending; the next tick runs it")


@once.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
def once_list(limit):
    """Recent requests: pending, running, done, failed or refused."""
    rt = runtime()
    rows = in_transaction(rt.sessions, lambda s: once_requests.listing(s, limit))
    if not rows:
        click.echo("no one-off requests")
        return
    now = clock.utcnow()
    click.echo(table(["id", "command", "source", "status", "exit", "asked"],
                     [[r.id, " ".join(json.loads(r.argv))[:50] or "-", r.source[:30], r.status, r.exit_code,
                       age(r.requested_at, now) + " ago"] for r in rows]))


@once.command("show")
@click.argument("request_id", type=click.IntRange(min=1))
def once_show(request_id):
    """One request with its output and exit code."""
    rt = runtime()
    with rt.sessions() as session:
        row = session.get(OnceRequest, request_id)
    if row is None:
        raise click.ClickException(f"no one-off request {request_id}")
    click.echo(f"request {row.id}: {' '.join(json.loads(row.argv))}")
    click.echo(f"source {row.source}, status {row.status}, exit code {row.exit_code}")
    click.echo(f"asked {row.requested_at:%Y-%m-%d %H:%M:%S} UTC"
               + (f", finished {row.finished_at:%Y-%m-%d %H:%M:%S} UTC" if row.finished_at else ""))
    if row.reason:
        click.echo(f"reason: {row.reason}")
    if row.output:
        click.echo("output:")
        click.echo(row.output.rstrip())


@once.command("run")
def once_run():
    """Collect *.cmd files and run pending requests now (what the tick does)."""
    rt = runtime()
    lock = rt.lock("once")  # the tick's run-once stage takes the same lock
    if not lock.acquire():
        click.echo("skipped: once run already running")
        return
    rt.host_lock = lock  # the commands it runs take their locks on this connection
    try:
        collected, ran = once_requests.run_holding_lock(rt)
    finally:
        rt.host_lock = None
        lock.release()
    click.echo(f"once: {collected} files collected, {ran} requests run")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
@click.pass_context
def health(ctx, as_json):
    """Check database, tick, backlogs, failures, disk and key permissions; exit 1 when something fails."""
    report = run_checks(runtime(migrate=False))
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        click.echo(table(["check", "status", "detail"], [[c.name, c.status, c.detail] for c in report.checks]))
        click.echo(f"health: {report.status}")
    ctx.exit(1 if report.status == FAIL else 0)
