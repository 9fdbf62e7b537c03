"""Running a forwarded job queue's jobs off RabbitMQ: `python -m cronbox amqp work --queue Q`.

The job worker (outbox.queue.worker.Worker), fed by the broker instead of its claim. Per message
(outbox.queue.job_messages: a job id and claim token, published by outbox.queue.publisher):
1. read it; a message that is not a job message is dropped (acked, logged: the job's state is its
   row, nothing is lost with it);
2. take the job (jobstore.take): its row, if it still holds the message's token. If not, the copy is
   stale (the job finished, failed, or was published again under a new claim) and is acked unrun;
3. run it through the worker's own path (Processor.process): the same pre-call gate (channel
   pause, concurrency-group slot, cost budgets, rate limit: shared through the database with every
   other worker, broker-fed or not), admission, timeout, and the same token-guarded writes of its
   outcome: done with the handler's `ctx.session` writes in one transaction, a retry with the
   handler's backoff (the row ready again: the publisher sends it when due), RetryLater without
   an attempt, PermanentFailure or the last try -> failed (`queue failed`, the console, /metrics);
4. only then the broker ack (batched: consumer_link.Link.ack). A crash before it brings the message
   again; its row no longer holds the token, so it is acked unrun.

A message the broker flags `redelivered` came back unacked: its worker died (or its connection did)
holding it. The first such message a connection takes whose row still holds its token counts an
attempt before it runs (messages are run in order, so it is the one that was in hand; the others
behind it were only read ahead): a job that kills every worker fails after its tries instead of
being delivered forever. Two copies of one claim running at once (a republish while its first copy
waited on a stopped worker, say) both reach the ack; its token guard lets one commit and rolls the
other back, so the database effect is once (outside effects, like an SMS, are at least once, as
after any crash).

The run is `amqp consume`'s (outbox.events.broker_loop: the connection, consumer_link.Link named
"cronbox worker", opened again with backoff after a loss; heartbeats; the heartbeat row `amqp work`);
SIGTERM/SIGINT finish the job in hand, ack it and exit; `--max-time`, `--max-jobs`, `--memory` as for
`queue work`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy.exc import DBAPIError

from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import is_connection_lost
from cronbox.outbox.core.text import clean_text, describe
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.run_loop import RunResult
from cronbox.outbox.events.broker import BrokerAddress
from cronbox.outbox.events.broker_loop import BrokerLoop, DatabaseLost
from cronbox.outbox.events.consumer_link import Link
from cronbox.outbox.events.unreadable import Unreadable
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.forward_jobs import BrokerQueue
from cronbox.outbox.queue.job_messages import NotAJob, read
from cronbox.outbox.queue.worker import Worker

log = logging.getLogger("cronbox")

HEARTBEAT = 60
UNKNOWN_HANDLER_WAIT = 60.0  # a job whose handler this worker lacks (another version's code) waits, no attempt used
NAME = "cronbox worker"


@dataclass
class BrokerWorkStats:
    stale: int = 0  # copies whose row no longer held their token: acked unrun
    bad: int = 0  # messages that are not job messages: dropped
    connects: int = 0
    not_here: list[str] = field(default_factory=list)  # handlers named by jobs this worker lacks


class BrokerWorker(Worker):
    def __init__(self, runtime, address: BrokerAddress, forwarded: list[BrokerQueue], *, prefetch: int = 10,
                 heartbeat_seconds: int = HEARTBEAT, stop_when_empty: bool = False):
        super().__init__(runtime, [f.name for f in forwarded])
        self.forwarded = forwarded
        self.names = ",".join(f.name for f in forwarded)
        broker_queues = tuple(dict.fromkeys(f.broker_queue for f in forwarded))
        self.link = Link(address, broker_queues[0], prefetch=prefetch, ordered=False, binds=[],
                         heartbeat_seconds=heartbeat_seconds, jobs=broker_queues, name=NAME)
        self.broker_stats = BrokerWorkStats()
        self.loop = BrokerLoop(runtime, self.link, command="amqp work", detail=self.names, counts=self.counts,
                               run_inbound=self._run_inbound, connected=self._connected, on_stop=self._hand_back,
                               stop_when_empty=stop_when_empty)

    def counts(self) -> dict:
        return {"jobs_done": self.stats.done, "jobs_failed": self.stats.gave_up}

    def work(self, budget: Budget) -> RunResult:
        """Run the queues' jobs as their messages come, until the budget says stop (or, with
        stop_when_empty, nothing comes for a second): outbox.events.broker_loop."""
        return self.loop.run(budget)

    def _connected(self) -> str:
        self.broker_stats.connects += 1
        return f"queues {','.join(self.link.jobs)} (prefetch {self.link.prefetch})"

    # -- the messages read so far --------------------------------------------------
    def _run_inbound(self, budget: Budget) -> None:
        """Run the messages read so far on one database connection (Processor.on_one_connection: its
        profiles read and written once, not per message), each acked once its outcome committed."""
        messages = list(self.link.inbound)
        self.link.inbound.clear()
        finished = 0

        def run_all() -> int:
            nonlocal finished
            self._budget = budget
            for message in messages:
                if finished and budget.stop_reason() is not None:
                    break
                self._run_message(message, budget)
                finished += 1
            return finished

        try:
            self.on_one_connection(run_all)
        except BaseException as exc:
            # The database gone, or an interrupt: back to the queue at their places (flagged
            # redelivered: the first counts an attempt, as if it had been in hand), their rows say the rest.
            for message in messages[finished:]:
                try:
                    self.link.give_back(message.delivery_tag)
                except Exception:
                    self.link.close(graceful=False)  # they come back anyway once the channel is gone
                    break
            if isinstance(exc, DBAPIError) and is_connection_lost(exc):
                raise DatabaseLost(describe(exc.orig or exc, 200)) from exc
            raise
        self.link.inbound.extendleft(reversed(messages[finished:]))  # the run stops: _hand_back has them

    def _hand_back(self) -> None:
        """The run stops: the messages read ahead but not started go back through their rows, not the
        broker. A message requeued by the broker comes back flagged redelivered, which counts an
        attempt (see the module's docstring); instead the broker is told to send no more, and each
        job read ahead is released (ready again, its claim's attempt given back: the publisher sends
        it again), then its message acked. Should that fail, closing the channel gives them back."""
        if not self.link.is_open:
            return
        try:
            self.link.cancel()
            messages = list(self.link.inbound)
            self.link.inbound.clear()
            jobs = []
            for message in messages:
                try:
                    jobs.append(read(message.body) if not isinstance(message, Unreadable) else None)
                except NotAJob:
                    jobs.append(None)
            named = [job for job in jobs if job is not None]
            if named:
                now = clock.utcnow()
                in_transaction(self.runtime.sessions, lambda s: [jobstore.release(s, [j.job_id], j.claim_token, now)
                                                                 for j in named])
                log.info("amqp work: %d jobs read ahead given back (ready again: published again)", len(named))
            for message in messages:
                self.link.ack(message.delivery_tag)
            self.link.flush_acks()
        except Exception as exc:
            log.warning("amqp work: could not give back the jobs read ahead (%s); the broker redelivers them",
                        describe(exc, 200))
            self.link.close(graceful=False)

    def _run_message(self, message, budget: Budget) -> None:
        tag = message.delivery_tag
        if isinstance(message, Unreadable):
            self._drop(tag, "its properties cannot be read", message)
            return
        try:
            named = read(message.body)
        except NotAJob as bad:
            self._drop(tag, str(bad), message)
            return
        counted = bool((message.delivery_info or {}).get("redelivered")) and not self.link.redelivery_seen
        item = self._transaction(lambda s: jobstore.take(s, named.job_id, named.claim_token, redelivered=counted))
        if item is None:
            self.broker_stats.stale += 1
            log.info("amqp work: job=%d stale copy (its row no longer holds this claim); acked unrun", named.job_id)
            self.link.ack(tag)
            return
        if counted:
            self.link.redelivery_seen = True
            log.warning("job=%d queue=%s came back unacked (its worker died holding it): attempt %d counted",
                        item.id, item.queue, item.attempts)
        if self.registry.get(item.handler) is None:
            self._not_here(item)
        else:
            self.process([item], budget)
        self.link.ack(tag)

    def _not_here(self, item) -> None:
        """A job whose handler this worker does not have (a worker running other code than the
        publisher's): it waits, no attempt used, for a worker that has it."""
        later = clock.utcnow() + timedelta(seconds=UNKNOWN_HANDLER_WAIT)
        error = f"no handler {item.handler} is registered in the broker worker that took it"
        self._transaction(lambda s: jobstore.reschedule(s, item, later, error, True))
        if item.handler not in self.broker_stats.not_here:
            self.broker_stats.not_here.append(item.handler)
        log.warning("job=%d queue=%s handler=%s is not registered here; waiting %.0fs (no attempt used) trace=%s",
                    item.id, item.queue, clean_text(item.handler, 191), UNKNOWN_HANDLER_WAIT, item.trace_id)

    def _drop(self, tag: int, why: str, message) -> None:
        self.broker_stats.bad += 1
        mid = clean_text(str((getattr(message, "properties", None) or {}).get("message_id") or "-"), 80)
        log.warning("amqp work: queues=%s message=%s dropped: %s", self.names, mid, why)
        self.link.ack(tag)
