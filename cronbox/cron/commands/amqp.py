"""`amqp ...`: consume a RabbitMQ queue with the registered consumers; its dead queue."""
from __future__ import annotations

import re

import click

from cronbox.cron.commands.base import CommandFailed, CommandGroup, runtime
from cronbox.cron.format import table
from cronbox.outbox.amqp.broker import NO_URL, parse_url
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import UnknownIds
from cronbox.outbox.core.text import UNSHOWABLE, clean_text
from cronbox.outbox.engine.admission import time_headroom
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events import queues

amqp = CommandGroup("amqp", help="Consume events from RabbitMQ (the VPS side of cronbox.forward), its dead queue, and "
                                 "run the jobs of queues forwarded to it (forward_jobs).")


class QueueName(click.ParamType):
    name = "queue"

    def convert(self, value, param, ctx):
        text = str(value)
        if (not text.strip() or len(text.encode("utf-8", "surrogatepass")) > queues.MAX_QUEUE
                or text.startswith("amq.") or _UNSHOWABLE.search(text)):
            self.fail(f"{clean_text(text, 300)!r} is not a queue name (1 to {queues.MAX_QUEUE} bytes, not starting "
                      "with 'amq.', no control characters)", param, ctx)
        return text


class Binding(click.ParamType):
    """EXCHANGE[:PATTERN], the pattern a topic binding key (default '#', everything)."""
    name = "exchange[:pattern]"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        exchange, _, pattern = str(value).partition(":")
        if not exchange or len(exchange) > 127 or len(pattern) > 255:
            self.fail(f"{value!r} is not EXCHANGE[:PATTERN]", param, ctx)
        return exchange, pattern or "#"


_UNSHOWABLE = re.compile(f"[{UNSHOWABLE}]")
QUEUE = click.option("--queue", "queue", type=QueueName(), required=True, help="The queue to consume.")


def _address(rt):
    url = rt.settings.get("CRONBOX_AMQP_URL")
    if not url:
        raise CommandFailed(NO_URL.replace("nowhere to forward to", "no broker to consume from"))
    return parse_url(url)


@amqp.command()
@QUEUE
@click.option("--prefetch", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Messages the broker may send ahead, unacked.")
@click.option("--max-time", type=click.FloatRange(min=1), default=None,
              help="Stop taking messages after S seconds (cron-style runs); default: run until stopped.")
@click.option("--max-messages", type=click.IntRange(min=1), default=None, help="Exit after N messages.")
@click.option("--bind", "binds", type=Binding(), multiple=True,
              help="Declare the queue (durable) and bind it to EXCHANGE with PATTERN (default '#'); repeatable.")
@click.option("--ordered", is_flag=True,
              help="Per-key order: single active consumer, prefetch 1, failures retried in place.")
@click.option("--heartbeat", type=click.IntRange(0, 600), default=60, show_default=True,
              help="AMQP heartbeat seconds (0: none); keep handler timeouts below it.")
@click.option("--max-redeliveries", type=click.IntRange(1, 1000), default=queues.MAX_REDELIVERIES, show_default=True,
              help="Park a message in QUEUE.dead once it came back unacked this many times (it killed the consumer).")
@click.pass_context
def consume(ctx, queue, prefetch, max_time, max_messages, binds, ordered, heartbeat, max_redeliveries):
    """Run the consumers registered for each message's type; SIGTERM finishes the message, then exits 0."""
    from cronbox.outbox.events.consume import QueueConsumer  # py-amqp: only for the amqp commands

    rt = runtime()
    address = _address(rt)
    consumer = QueueConsumer(rt, address, queue, prefetch=prefetch, ordered=ordered, binds=list(binds),
                             heartbeat_seconds=heartbeat, max_redeliveries=max_redeliveries)
    started = clock.monotonic()
    result = consumer.run(Budget(max_time=max_time, memory_mb=None, max_handled=max_messages))
    s = consumer.stats
    click.echo(f"amqp consume: {s.done} done, {s.duplicates} duplicates, {s.retried} retried, {s.deferred} deferred, "
               f"{s.parked} parked ({s.bad} bad) in {clock.monotonic() - started:.2f}s; stopped: {result.stop_reason}")
    if result.error:
        click.echo(f"error: {result.error}", err=True)
    ctx.exit(result.exit_code)


@amqp.command()
@click.option("--queue", "names", type=click.STRING, required=True, multiple=True,
              help="A job queue to run (declared with cronbox.forward_jobs); repeatable.")
@click.option("--prefetch", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Messages the broker may send ahead, unacked.")
@click.option("--stop-when-empty", is_flag=True, help="Exit once no message came for a second (for cron).")
@click.option("--max-time", type=click.FloatRange(min=1), default=None, help="Stop starting jobs after S seconds.")
@click.option("--max-jobs", type=click.IntRange(min=1), default=None, help="Exit after N jobs.")
@click.option("--memory", type=click.FloatRange(min=8), default=None, help="Exit when RSS passes MB.")
@click.option("--heartbeat", type=click.IntRange(0, 600), default=60, show_default=True,
              help="AMQP heartbeat seconds (0: none); a job longer than two of them loses the connection "
                   "(harmless: it reconnects after the job).")
@click.pass_context
def work(ctx, names, prefetch, stop_when_empty, max_time, max_jobs, memory, heartbeat):
    """Run the jobs of a queue forwarded to RabbitMQ; SIGTERM finishes the job in hand, then exits 0."""
    from cronbox.outbox.queue.broker_worker import BrokerWorker  # py-amqp: only for the amqp commands

    rt = runtime()
    forwarded = []
    for name in dict.fromkeys(names):
        declared = rt.registry.broker_queues.get(name)
        if declared is None:
            raise CommandFailed(f"queue {clean_text(name, 80)!r} is not forwarded to RabbitMQ by this app's handlers "
                                "(cronbox.forward_jobs): the tick runs its jobs")
        if declared.protocol != "cronbox":
            raise CommandFailed(f"queue {clean_text(name, 80)!r} is forwarded as Celery task messages: your "
                                f"`celery worker -Q {declared.broker_queue}` runs them")
        forwarded.append(declared)
    _refuse_shared_broker_queues(rt.registry.broker_queues.in_order(), forwarded)
    worker = BrokerWorker(rt, _address(rt), forwarded, prefetch=prefetch, heartbeat_seconds=heartbeat,
                          stop_when_empty=stop_when_empty)
    started = clock.monotonic()
    result = worker.work(Budget(max_time=max_time, memory_mb=memory, max_handled=max_jobs,
                                time_headroom=time_headroom(rt.settings)))
    s, b = worker.stats, worker.broker_stats
    click.echo(f"amqp work: {s.done + s.retried + s.gave_up} jobs ({s.done} done, {s.retried} retried, {s.gave_up} "
               f"failed, {s.deferred} deferred), {b.stale} refused (stale or forged), {b.bad} bad messages in "
               f"{clock.monotonic() - started:.2f}s; stopped: {result.stop_reason}")
    if result.error:
        click.echo(f"error: {result.error}", err=True)
    ctx.exit(result.exit_code)


def _refuse_shared_broker_queues(declared, served) -> None:
    """A worker refuses every message of a queue it does not run (jobstore.take): so it must run every
    queue whose messages go to the broker queues it reads, or those would be refused, and wait."""
    names, broker_queues = {f.name for f in served}, {f.broker_queue for f in served}
    for other in declared:
        if other.name not in names and other.broker_queue in broker_queues:
            raise CommandFailed(f"broker queue {clean_text(other.broker_queue, 80)!r} also carries the jobs of queue "
                                f"{clean_text(other.name, 80)!r}, which this worker would refuse: run them together "
                                f"(--queue {clean_text(other.name, 80)}), or give each its own broker_queue")


@amqp.command()
@QUEUE
@click.option("--limit", type=click.IntRange(1, 10000), default=200, show_default=True,
              help="List at most this many parked messages (they stay parked).")
def dead(queue, limit):
    """List the messages parked in QUEUE.dead (they stay there)."""
    from cronbox.outbox.events.parked import DeadQueue

    with DeadQueue(_address(runtime(migrate=False)), queue) as dq:
        rows, total = dq.list(limit)
    if not rows:
        click.echo(f"no parked messages in {queues.dead_queue(queue)}")
        return
    click.echo(table(["message id", "type", "key", "attempts", "parked at", "reason"],
                     [[r.message_id, r.type, r.key, r.attempts, r.parked_at, r.reason[:100]] for r in rows]))
    if total > len(rows):
        click.echo(f"{len(rows)} of {total} shown (--limit)")


@amqp.command("retry-dead")
@QUEUE
@click.option("--message-id", "message_ids", multiple=True, help="A parked message to move back; repeatable.")
@click.option("--all", "all_", is_flag=True, help="Move every parked message back.")
def retry_dead(queue, message_ids, all_):
    """Move parked messages back to QUEUE with their attempts reset."""
    if bool(message_ids) == bool(all_):
        raise click.UsageError("give --message-id ID (repeatable) or --all (not both)")
    from cronbox.outbox.events.parked import DeadQueue

    with DeadQueue(_address(runtime(migrate=False)), queue) as dq:
        moved, unknown = dq.move_back(None if all_ else list(dict.fromkeys(message_ids)))
        unreadable = len(dq.unreadable)
    click.echo(f"retry-dead: {moved} messages moved back to {queue}")
    if unknown:
        raise UnknownIds("parked message", unknown)
    if unreadable and all_:  # never moved: nothing of it can be read to publish it again
        raise CommandFailed(f"{unreadable} parked message(s) py-amqp cannot read stay in {queues.dead_queue(queue)} "
                           "(amqp dead lists them)")
