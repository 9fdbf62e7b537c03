"""`once add|list|show|run`: one-off runs of allow-listed commands, asked for without SSH."""
from __future__ import annotations

import json

import click

from cronbox.cron.commands.base import CommandGroup, command_runner, runtime
from cronbox.cron.format import age, table
from cronbox.cron.scheduling import once as once_requests
from cronbox.outbox.core import clock
from cronbox.outbox.core.transactions import in_transaction


@click.group(cls=CommandGroup)
def once():
    """One-off runs of allow-listed commands, asked for without SSH."""


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
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Show at most this many requests, latest first.")
def once_list(limit):
    """Recent requests: pending, running, done, failed or refused."""
    rt = runtime()
    rows = in_transaction(rt.sessions, lambda s: once_requests.page(s, size=limit)).rows
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
    row = in_transaction(rt.sessions, lambda s: once_requests.get(s, request_id))
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
    """Collect the run-once folder's .cmd files and run pending requests now (what the tick does)."""
    rt = runtime()
    lock = rt.lock("once")  # the tick's run-once stage takes the same lock
    if not lock.acquire():
        click.echo("skipped: once run already running")
        return
    rt.host_lock = lock  # the commands it runs take their locks on this connection
    try:
        collected, ran = once_requests.run_holding_lock(rt, command_runner())
    finally:
        rt.host_lock = None
        lock.release()
    click.echo(f"once: {collected} files collected, {ran} requests run")
