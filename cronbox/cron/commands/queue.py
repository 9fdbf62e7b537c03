"""`queue ...`: work, status, groups, profiles, pools, failed, show, retry, resume, forget, flush, prune, batches,
batch, chain."""
from __future__ import annotations

import click

from cronbox.cron.commands.base import CommandGroup, runtime
from cronbox.cron.format import (DURATION, PRUNE_FLOOR, Checked, Duration, PageCursor, age, never_fits_lines, print_shown,
                                  reveal_options, table)
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import UnknownIds
from cronbox.outbox.core.lock_wait import run_lock_waits
from cronbox.outbox.core.notify import own_listener
from cronbox.outbox.core.sealing import JOBS
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine import heartbeat, profiles
from cronbox.outbox.engine.admission import time_headroom
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.run_loop import record_run, run_loop, start_within
from cronbox.outbox.queue import batches, chains, groups, jobstore, pauses
from cronbox.outbox.queue.jobs import QUEUE_NAME
from cronbox.outbox.queue.pool import Pool, PoolRefused, check_budget
from cronbox.outbox.queue.worker import Worker
import cronbox.outbox.channels  # noqa: F401  (the channels' and admin alerts' jobs: registered in every worker)

# _RETENTION_LATER: `flush` and `prune` import cronbox.cron.scheduling.retention when they run: it loads the
# console's, the channels' and the event outbox's tables, which `queue work` (a process a minute) never uses.

queue = CommandGroup("queue", help="The job queue: run workers, inspect and repair jobs.")


QUEUE = Checked(QUEUE_NAME.match, "a queue name (1 to 64 of A-Z a-z 0-9 _ . : -)", "queue")


def _queue_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [q.strip() for q in text.split(",") if q.strip()]
    bad = [q for q in names if not QUEUE_NAME.match(q)]
    if not names or bad:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of queue names", param_hint="--queue")
    return list(dict.fromkeys(names))


@queue.command()
@click.option("--queue", "queues", help="Queues in strict priority order, e.g. sms,notifications.")
@click.option("--stop-when-empty", is_flag=True, help="Exit when no job is due (for cron).")
@click.option("--once", is_flag=True, help="Run at most one job, then exit.")
@click.option("--max-time", type=click.FloatRange(min=1), default=None, help="Stop starting jobs after S seconds.")
@click.option("--max-jobs", type=click.IntRange(min=1), default=None,
              help="Exit after N jobs (with a pool: per worker).")
@click.option("--memory", type=click.FloatRange(min=8), default=None,
              help="Exit when RSS passes MB (with a pool: the whole pool's, parent and workers).")
@click.option("--sleep", type=click.FloatRange(min=0.05), default=3.0, show_default=True,
              help="Seconds between polls when no job is due.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Fork N worker processes and supervise them (within CRONBOX_MAX_CONNECTIONS).")
@click.option("--min-workers", type=click.IntRange(min=1), default=None,
              help="With --max-workers: scale between these with the backlog and --memory.")
@click.option("--max-workers", type=click.IntRange(min=1), default=None, help="See --min-workers.")
@click.pass_context
def work(ctx, queues, stop_when_empty, once, max_time, max_jobs, memory, sleep, workers, min_workers, max_workers):
    """Run jobs, queues in strict priority order, in this process or a pool of worker processes (--workers).
    Limits are checked between jobs; SIGTERM finishes the current job, then exits 0."""
    names = _queue_list(queues)
    smallest, largest = _pool_size(workers, min_workers, max_workers, once)
    rt = runtime(migrate=False)  # the schema is checked below, its lock wait bounded by --max-time
    forwarded = [q for q in names or [] if rt.registry.broker_queues.get(q) is not None]
    if forwarded:
        raise click.UsageError(f"queue {forwarded[0]} is forwarded to RabbitMQ (forward_jobs): its jobs run under "
                               f"`amqp work --queue {forwarded[0]}`")
    names = names or rt.default_queues()
    if not names:
        raise click.UsageError("no queues to work: register jobs (CRONBOX_HANDLERS) or pass --queue (a queue "
                               "forwarded to RabbitMQ runs under `amqp work`)")
    if largest > 1:
        rt.ensure_schema()
        _work_in_pool(ctx, rt, names, smallest, largest, stop_when_empty=stop_when_empty, max_time=max_time,
                      max_jobs=max_jobs, memory=memory, sleep=sleep)
        return
    worker = Worker(rt, names)
    budget = Budget(max_time=max_time, memory_mb=memory, max_handled=1 if once else max_jobs,
                    time_headroom=time_headroom(rt.settings))
    started = clock.monotonic()
    result = start_within(rt.engine, budget, rt.ensure_schema, "the schema check")
    if result is None:
        linger = not (stop_when_empty or once)
        # PostgreSQL: a lingering worker listens on a connection of its own (outbox.core.notify).
        listening = own_listener(rt.lock_engine, frozenset({"cronbox_jobs"})) if linger else None
        listener, stop_listening = listening if listening is not None else (None, lambda: None)
        try:
            with run_lock_waits(rt.engine, budget.remaining):
                result = record_run(rt.sessions, "work",
                                    lambda: run_loop([worker.run], budget, linger=linger, poll=sleep,
                                                     listener=listener),
                                    lambda: {"jobs_done": worker.stats.done, "jobs_failed": worker.stats.gave_up})
        finally:
            stop_listening()
    s = worker.stats
    ran = s.done + s.retried + s.gave_up + s.lease_lost
    click.echo(f"queue work: {ran} jobs ({s.done} done, {s.retried} retried, {s.gave_up} failed, {s.deferred} "
               f"deferred) in {clock.monotonic() - started:.2f}s; stopped: {result.stop_reason}")
    ctx.exit(result.exit_code)


def _pool_size(workers, min_workers, max_workers, once) -> tuple[int, int]:
    """(min, max) workers; (1, 1) is the plain in-process worker."""
    if workers is not None and (min_workers is not None or max_workers is not None):
        raise click.UsageError("give --workers N, or --min-workers/--max-workers, not both")
    if workers is not None:
        smallest = largest = workers
    else:
        largest = max_workers or min_workers or 1
        smallest = min_workers or 1
        if smallest > largest:
            raise click.UsageError(f"--min-workers {smallest} is more than --max-workers {largest}")
    if once and largest > 1:
        raise click.UsageError("--once runs one job in this process: it takes no --workers")
    return smallest, largest


def _work_in_pool(ctx, rt, names, smallest, largest, *, stop_when_empty, max_time, max_jobs, memory, sleep):
    try:
        check_budget(rt.settings, largest, what="--max-workers" if smallest < largest else "--workers")
        pool = Pool(rt, names, min_workers=smallest, max_workers=largest, stop_when_empty=stop_when_empty,
                    sleep=sleep, max_jobs=max_jobs, memory_mb=memory)
    except PoolRefused as exc:
        raise click.UsageError(str(exc)) from None
    started = clock.monotonic()
    result = pool.run(Budget(max_time=max_time, memory_mb=None))
    click.echo(f"queue work: pool of {pool.stats.describe(smallest, largest)} in {clock.monotonic() - started:.2f}s; "
               f"stopped: {result.stop_reason}")
    ctx.exit(result.exit_code)


@queue.command()
def status():
    """Per queue: ready, delayed, reserved, failed, oldest ready age; then paused channels, concurrency
    groups and cost budgets (when there are any), the last worker pool, and handlers that never fit a run."""
    rt = runtime()
    now = clock.utcnow()
    queues, paused, pools, in_groups, spent, never = in_transaction(rt.sessions, lambda s: (
        jobstore.overview(s, rt.listed_queues(), now), pauses.active(s, now), heartbeat.recent(s, "pool", 1),
        groups.overview(s, rt.jobs, now), groups.budget_overview(s, rt.settings, now),
        profiles.never_fitting(s, "job")))
    if not queues:
        click.echo("no queues")
    else:
        rows = [[st.queue, st.ready, st.delayed, st.reserved, st.failed, age(st.oldest_ready_at, now)]
                for st in queues]
        click.echo(table(["queue", "ready", "delayed", "reserved", "failed", "oldest ready"], rows))
    if paused:
        click.echo("paused channels (lift with `queue resume CHANNEL`):")
        click.echo(table(["channel", "until", "left", "reason"],
                         [[p.channel, f"{p.paused_until:%Y-%m-%d %H:%M:%S} UTC", age(now, p.paused_until), p.reason]
                          for p in paused]))
    _show_groups(in_groups, spent, quiet=True)
    for run in pools:  # the last worker pool (queue work --workers, or a tick's)
        ended = f"stopped: {run.outcome}" if run.finished_at else "running"
        click.echo(f"last pool: {run.detail or ''}; started {age(run.started_at, now)} ago, {ended}")
    for line in never_fits_lines(never, now):
        click.echo(line)


@queue.command(name="profiles")
def profiles_():
    """Per handler (jobs and deliveries): runs, mean duration, peak RSS growth, last update (stale past
    CRONBOX_PROFILE_TTL), never-fits reason: admission's profiles."""
    rt = runtime()
    now = clock.utcnow()
    window = profiles.ProfileSettings.of(rt.settings)
    view = in_transaction(rt.sessions, lambda s: profiles.overview(s, window, now))
    if not view:
        click.echo("no handler profiles yet (they are recorded as handlers run)")
        return
    click.echo(table(["kind", "handler", "runs", "samples", "mean ms", "peak growth MB", "updated", "never fits"],
                     [[v.kind, v.handler, v.runs, f"{v.samples}" + (" (stale)" if v.stale else ""), v.duration_ms,
                       f"{v.rss_growth_kb / 1024:.1f}", age(v.updated_at, now) + " ago", v.never_fits]
                      for v in view]))


@queue.command()
@click.option("--limit", type=click.IntRange(min=1, max=100), default=10, show_default=True,
              help="Show at most this many pool runs, latest first.")
def pools(limit):
    """The last worker pools (`queue work --workers`, the tick's CRONBOX_TICK_WORKERS): workers, restarts, outcome."""
    rt = runtime()
    now = clock.utcnow()
    runs = in_transaction(rt.sessions, lambda s: heartbeat.recent(s, "pool", limit))
    if not runs:
        click.echo("no worker pool has run")
        return
    click.echo(table(["started", "took", "outcome", "pool"],
                     [[age(r.started_at, now) + " ago", age(r.started_at, r.finished_at) if r.finished_at else "-",
                       r.outcome if r.finished_at else "running", r.detail] for r in runs]))


@queue.command("groups")
def groups_command():
    """Concurrency groups (limit, slots in use, jobs waiting) and cost budgets (used / limit in the
    current window, CRONBOX_QUEUE_BUDGETS / CRONBOX_GROUP_BUDGETS)."""
    rt = runtime()
    now = clock.utcnow()
    in_groups, spent = in_transaction(rt.sessions, lambda s: (groups.overview(s, rt.jobs, now),
                                                              groups.budget_overview(s, rt.settings, now)))
    _show_groups(in_groups, spent, quiet=False)


def _show_groups(in_groups, spent, *, quiet: bool) -> None:
    """`quiet` (queue status): nothing at all when no group or budget exists."""
    if in_groups:
        click.echo("concurrency groups:")
        click.echo(table(["group", "limit", "in use", "waiting"],
                         [[g.name, g.limit if g.limit is not None else "undeclared", g.in_use, g.waiting]
                          for g in in_groups]))
    elif not quiet:
        click.echo("no concurrency groups")
    if spent:
        click.echo("cost budgets:")
        click.echo(table(["budget", "used", "limit", "window", "resets in"],
                         [[f"{u.budget.scope} {u.budget.name}", u.used, u.budget.limit, f"{u.budget.per_seconds}s",
                           f"{u.resets_in:.0f}s"] for u in spent]))
    elif not quiet:
        click.echo("no cost budgets (CRONBOX_QUEUE_BUDGETS, CRONBOX_GROUP_BUDGETS)")


@queue.command()
@click.option("--queue", "queue_name", type=QUEUE, default=None, help="Only this queue.")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=200, show_default=True,
              help="Show at most this many failed jobs (a full page ends with the --after to continue).")
@click.option("--after", "cursor", type=PageCursor(jobstore.FAILED_KEY), default=None,
              help="Continue after this cursor (printed at the end of a full page).")
def failed(queue_name, limit, cursor):
    """Failed jobs, latest first, with their error and trace id (ids for retry / forget)."""
    rt = runtime()
    page = in_transaction(rt.sessions, lambda s: jobstore.failed_page(s, cursor, queue=queue_name, size=limit))
    rows = page.rows
    if not rows:
        click.echo("no failed jobs")
        return
    now = clock.utcnow()
    click.echo(table(["id", "queue", "handler", "attempts", "failed", "trace", "error"],
                     [[r.id, r.queue, r.handler, r.attempts, age(r.finished_at, now) + " ago", r.trace_id,
                       (r.last_error or "")[:80]] for r in rows]))
    if page.after:
        click.echo(f"more: queue failed{f' --queue {queue_name}' if queue_name else ''} --after {page.after}")


@queue.command()
@click.argument("ids", nargs=-1, type=click.IntRange(min=1))
@click.option("--all", "all_", is_flag=True, help="Retry every failed job (of --queue).")
@click.option("--queue", "queue_name", type=QUEUE, default=None, help="With --all: only this queue.")
def retry(ids, all_, queue_name):
    """Put failed jobs back on their queue with fresh attempts (unknown ids are reported)."""
    if bool(ids) == bool(all_):
        raise click.UsageError("give job ids or --all (not both)")
    rt = runtime()
    wanted = None if all_ else list(dict.fromkeys(ids))
    count, unknown = in_transaction(rt.sessions, lambda s: jobstore.retry_failed(s, wanted, queue_name,
                                                                                 clock.utcnow()))
    click.echo(f"retry: {count} jobs queued again")
    if unknown:
        raise UnknownIds("failed job", unknown)


@queue.command("batches")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=50, show_default=True,
              help="Show at most this many batches, newest first.")
def batches_command(limit):
    """Batches, newest first: their progress (done, failed, cancelled, pending) and state."""
    rt = runtime()

    def read(session):
        page = batches.page(session, None, size=limit)
        return batches.progress_of(session, page.rows)

    shown = in_transaction(rt.sessions, read)
    if not shown:
        click.echo("no batches")
        return
    now = clock.utcnow()
    click.echo(table(["id", "name", "state", "done", "failed", "cancelled", "pending", "created"],
                     [[p.id, p.name, p.state, p.done, p.failed, p.cancelled, p.pending,
                       age(p.created_at, now) + " ago"] for p in shown]))


MEMBERS_SHOWN = 200  # `queue batch ID`: the newest members listed


@queue.command("batch")
@click.argument("batch_id", type=click.IntRange(min=1))
@click.option("--cancel", is_flag=True, help="Cancel it: its members not started yet never start.")
@click.option("--retry-failed", is_flag=True, help="Put its failed members back on their queues (the batch "
                                                    "opens again: its callbacks run again when they finish).")
def batch_command(batch_id, cancel, retry_failed):
    """One batch: its progress and its members by state (failed ones with their error)."""
    rt = runtime()
    now = clock.utcnow()
    if cancel and retry_failed:
        raise click.UsageError("give --cancel or --retry-failed, not both")
    if cancel:
        stopped, after = in_transaction(rt.sessions, lambda s: batches.cancel_running(s, batch_id, now))
        if after is None:
            raise click.UsageError(f"no batch {batch_id}")
        if stopped is None:
            click.echo(f"queue batch: batch {batch_id} is {after.state}: nothing to cancel")
        else:
            click.echo(f"queue batch: batch {batch_id} cancelled; {stopped} members not started stopped")
    if retry_failed:
        count = in_transaction(rt.sessions, lambda s: jobstore.retry_batch(s, batch_id, now))
        click.echo(f"queue batch: {count} failed members of batch {batch_id} queued again")
    found = in_transaction(rt.sessions, lambda s: batches.progress(s, batch_id))
    if found is None:
        raise click.UsageError(f"no batch {batch_id}")
    click.echo(f"batch {found.id} {found.name!r}: {found.state}; done {found.done}, failed {found.failed}, "
               f"cancelled {found.cancelled}, pending {found.pending} of {found.total}")
    page = in_transaction(rt.sessions, lambda s: batches.members_page(s, batch_id, size=MEMBERS_SHOWN))
    if page.rows:
        click.echo(table(["id", "handler", "status", "attempts", "error"],
                         [[r.id, r.handler, r.status, r.attempts, (r.last_error or "")[:80]] for r in page.rows]))
    if page.after:
        click.echo(f"(the newest {MEMBERS_SHOWN} members; the console's batch page shows them all, by state)")


@queue.command("chain")
@click.argument("job_id", type=click.IntRange(min=1))
def chain_command(job_id):
    """The chain whose step is job JOB_ID (any step's): the step it is on, and each step's state."""
    rt = runtime()
    found = in_transaction(rt.sessions, lambda s: chains.chain_progress(s, job_id))
    if found is None:
        raise click.UsageError(f"job {job_id} is not a step of a chain (or is gone)")
    current = found.current
    where = f", on step {current.index + 1} of {len(found.steps)} ({current.handler})" if current is not None else ""
    click.echo(f"chain {found.id}: {found.state}{where}")
    shown = [(step.index + 1, step) for step in found.steps] + ([("catch", found.catch)] if found.catch else [])
    rows = [[label, step.job_id, step.handler, step.status, step.attempts, (step.error or "")[:80]]
            for label, step in shown]
    click.echo(table(["step", "job", "handler", "status", "attempts", "error"], rows))


@queue.command()
@click.argument("channel", type=Checked(lambda t: t != "" and t.isprintable(), "a channel name", "channel"))
def resume(channel):
    """Lift CHANNEL's pause (after fixing its settings or topping up credit): the jobs it held back are
    due at once, with their attempts intact. Exit 0 also when CHANNEL is not paused; 2 when no job
    sends through it. If the cause is not fixed, the next send pauses the channel again."""
    rt = runtime()
    moved = in_transaction(rt.sessions, lambda s: pauses.lift(s, rt.jobs, channel, clock.utcnow()))
    if moved is not None:
        click.echo(f"queue resume: channel {channel} resumed; {moved} waiting jobs are due now")
        return
    known = pauses.channels(rt.jobs)
    if channel not in known:
        raise click.UsageError(f"no job sends through channel {channel!r} "
                               f"(channels: {', '.join(sorted(known)) or 'none'})")
    click.echo(f"queue resume: channel {channel} is not paused; nothing to do")


@queue.command()
@click.argument("job_id", type=click.IntRange(min=1))
@reveal_options
def show(job_id, reveal, reason):
    """One job and its payload, masked (`sealed (N bytes, key K)`) unless --reveal."""
    print_shown(runtime(), JOBS, job_id, reveal, reason)


@queue.command()
@click.argument("ids", nargs=-1, required=True, type=click.IntRange(min=1))
def forget(ids):
    """Delete failed jobs."""
    rt = runtime()
    count, unknown = in_transaction(rt.sessions, lambda s: jobstore.forget(s, list(dict.fromkeys(ids))))
    click.echo(f"forget: {count} failed jobs deleted")
    if unknown:
        raise UnknownIds("failed job", unknown)


@queue.command()
@click.option("--older-than", type=DURATION, default=None, help="Only failed jobs older than this (e.g. 10d).")
def flush(older_than):
    """Delete failed jobs (all, or those that failed before --older-than)."""
    from cronbox.cron.scheduling.retention import flush_failed  # see _RETENTION_LATER

    total = flush_failed(runtime(), older_than)
    click.echo(f"flush: {total} failed jobs deleted")


@queue.command()
@click.option("--older-than", type=Duration(PRUNE_FLOOR.total_seconds(), "1h"), default="48h", show_default=True,
              help="Delete finished (done) jobs older than this (at least 1h).")
def prune(older_than):
    """Delete done jobs older than --older-than, send attempts after 30 days, read notifications after
    90 days and old rate-limit windows, in bounded batches (cron/scheduling/retention.py lists every rule)."""
    from cronbox.cron.scheduling.retention import prune_queue  # see _RETENTION_LATER

    counts = prune_queue(runtime(), older_than)
    click.echo("prune: " + ", ".join(f"{n} {what}" for what, n in counts.items()) + " deleted")
