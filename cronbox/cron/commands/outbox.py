"""`outbox ...`: publish, status, dead, show, retry, skip, prune."""
from __future__ import annotations

import click

from cronbox.cron.commands.base import CommandGroup, runtime
from cronbox.cron.format import PRUNE_FLOOR, Duration, PageCursor, age, never_fits_lines, print_shown, reveal_options, table
from cronbox.cron.scheduling.retention import prune_outbox
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import UnknownIds
from cronbox.outbox.core.lock_wait import run_lock_waits
from cronbox.outbox.core.sealing import EVENTS
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine import profiles
from cronbox.outbox.engine.admission import time_headroom
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.run_loop import record_run, run_loop
from cronbox.outbox.events import deliveries
from cronbox.outbox.events.relay import Relay

outbox = CommandGroup("outbox", help="The transactional outbox: relay, inspect and repair deliveries.")


@outbox.command()
@click.argument("event_id", type=click.IntRange(min=1))
@reveal_options
def show(event_id, reveal, reason):
    """One event and its payload, masked (`sealed (N bytes, key K)`) unless --reveal."""
    print_shown(runtime(), EVENTS, event_id, reveal, reason)


@outbox.command()
@click.option("--max-time", type=click.FloatRange(min=1), default=None, help="Stop claiming after this many seconds.")
@click.pass_context
def publish(ctx, max_time):
    """Relay due events to their consumers once, without the tick lock (may run beside a tick)."""
    rt = runtime()
    relay = Relay(rt)
    budget = Budget(max_time=max_time, memory_mb=None, time_headroom=time_headroom(rt.settings))
    try:
        with run_lock_waits(rt.engine, budget.remaining):
            result = record_run(rt.sessions, "publish", lambda: run_loop([relay.run], budget, linger=False),
                                lambda: {"delivered": relay.stats.done, "retried": relay.stats.retried,
                                         "dead": relay.stats.gave_up})
    finally:
        relay.close()
    s = relay.stats
    click.echo(f"publish: delivered {s.done}, retried {s.retried}, deferred {s.deferred}, dead {s.gave_up} "
               f"(stopped: {result.stop_reason})")
    ctx.exit(result.exit_code)


@outbox.command()
def status():
    """Per consumer: pending, due, dead, blocked keys, oldest due age; then consumers that never fit a run."""
    rt = runtime()
    now = clock.utcnow()
    view, never = in_transaction(rt.sessions, lambda s: (deliveries.overview(s, rt.consumers, now),
                                                         profiles.never_fitting(s, "delivery")))
    rows = [[name if registered else f"{name} (not registered here)", st.pending, st.due, st.dead,
             st.blocked_keys, age(st.oldest_due_at, now)] for name, registered, st in view.consumers]
    click.echo(table(["consumer", "pending", "due", "dead", "blocked keys", "oldest due"], rows)
               if rows else "no consumers registered and no deliveries")
    click.echo(f"events not yet fanned out: {view.unfanned}")
    if view.blocked:
        click.echo("blocked keys (consumer, key, held by delivery, waiting behind it):")
        for row in view.blocked:
            click.echo(f"  {row.consumer}  {row.key}  #{row.id} ({row.status})  {row.waiting} waiting")
    for line in never_fits_lines(never, now):
        click.echo(line)


@outbox.command()
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=200, show_default=True,
              help="Show at most this many dead deliveries (a full page ends with the --after to continue).")
@click.option("--after", "cursor", type=PageCursor(deliveries.DEAD_KEY), default=None,
              help="Continue after this cursor (printed at the end of a full page).")
def dead(limit, cursor):
    """List dead deliveries, latest attempt first (ids for `outbox retry` / `outbox skip`)."""
    rt = runtime()
    page = in_transaction(rt.sessions, lambda s: deliveries.dead_page(s, cursor, size=limit))
    if not page.rows:
        click.echo("no dead deliveries")
        return
    now = clock.utcnow()
    click.echo(table(
        ["id", "consumer", "event", "type", "key", "attempts", "died", "last error"],
        [[r.id, r.consumer, r.event_id, r.type, r.key, r.attempts, age(r.finished_at, now) + " ago",
          (r.last_error or "")[:80]] for r in page.rows],
    ))
    if page.after:
        click.echo(f"more: outbox dead --after {page.after}")


def _ids_or_all(ids: tuple[int, ...], all_: bool) -> list[int] | None:
    if bool(ids) == bool(all_):
        raise click.UsageError("give delivery ids or --all (not both)")
    return None if all_ else list(dict.fromkeys(ids))


@outbox.command()
@click.argument("ids", nargs=-1, type=click.IntRange(min=1))
@click.option("--all", "all_", is_flag=True, help="Retry every dead delivery.")
def retry(ids, all_):
    """Bring dead deliveries back with fresh attempts."""
    wanted = _ids_or_all(ids, all_)
    rt = runtime()
    revived, unknown = in_transaction(rt.sessions, lambda s: deliveries.retry(s, wanted, clock.utcnow()))
    click.echo(f"retry: {revived} deliveries pending again")
    if unknown:
        raise UnknownIds("dead delivery", unknown)


@outbox.command()
@click.argument("ids", nargs=-1, type=click.IntRange(min=1))
@click.option("--all", "all_", is_flag=True, help="Skip every dead delivery.")
def skip(ids, all_):
    """Give up on deliveries (dead or waiting), releasing the keys they hold."""
    wanted = _ids_or_all(ids, all_)
    rt = runtime()
    skipped, unknown = in_transaction(rt.sessions, lambda s: deliveries.skip(s, wanted, clock.utcnow()))
    click.echo(f"skip: {skipped} deliveries skipped")
    if unknown:
        raise UnknownIds("skippable delivery", unknown)


@outbox.command()
@click.option("--older-than", type=Duration(PRUNE_FLOOR.total_seconds(), "1h"), default="7d", show_default=True,
              help="Delete delivered events older than this (e.g. 7d, 48h; at least 1h).")
def prune(older_than):
    """Delete delivered events, their deliveries and old heartbeats, in bounded batches."""
    rt = runtime()
    events, beats = prune_outbox(rt, older_than)
    click.echo(f"prune: {events} events and {beats} heartbeats deleted")
