"""Running a forwarded job queue's jobs off RabbitMQ: `python -m cronbox amqp work --queue Q`.

The job family's runner (outbox.engine.runner, outbox.queue.job_family), fed by the broker instead
of the database worker's claim (outbox.queue.worker). Per batch of
messages read (outbox.queue.job_messages: a job id and the publisher's claim token each, published by
outbox.queue.publisher):
1. read them; a message that is not a job message is dropped (acked, logged: the job's state is its
   row, nothing is lost with it);
2. take their jobs (jobstore.take), in one short transaction: a job of this worker's queues still
   reserved under the token its own message carries gets a claim token of this worker's own, the
   attempt counted and the handler's lease, exactly as the database worker's claim. Only one copy of
   a message can take its job; any other message is refused and acked, its job untouched: a copy
   that finds it taken, finished, failed or sent again under another claim (stale), another queue's
   job, a token that is not the job's, no such job (forged). Each refusal, and each message that is
   not a job message, is one WARNING line (the message id and why; never a token or payload), at
   most REFUSALS_LOGGED a minute and then a count (outbox.core.logs.LimitedLines). From here the row
   is the job's only state: the messages are acked once the batch's jobs ran;
3. run the taken jobs through the runner, as the database worker does: the same pre-call gate
   (channel pause, concurrency-group slot, cost budgets, rate limit: shared through the database with
   every other worker, broker-fed or not), admission, timeout, and the same token-guarded writes of
   their outcomes: done with the handler's `ctx.session` writes in one transaction, a retry with the
   handler's backoff (the row ready again: the publisher sends it when due), RetryLater without an
   attempt, PermanentFailure or the last try -> failed (`queue failed`, the console, /metrics); jobs
   taken but not started when the run stops go back to the broker (BrokerReturns.release): each row
   reserved again under its message's token, the attempt given back (jobstore.untake), and the
   message requeued instead of acked, so the next worker runs it without waiting for a publish.

A worker killed after its take leaves the jobs reserved under its token until their leases end, as a
killed database worker does; the publisher then sends them again (same token, flagged "again"), and
the next worker takes each such copy alone: a job that killed its worker costs only its own attempt,
and after its tries it fails. Messages read but not taken go back to the queue, unchanged.

The run is `amqp consume`'s (outbox.amqp.broker_loop: the connection, consumer_link.Link named
"cronbox worker", opened again with backoff after a loss; heartbeats; the heartbeat row `amqp work`);
SIGTERM/SIGINT finish the job in hand and exit; `--max-time`, `--max-jobs`, `--memory` as for
`queue work`. A handler that runs longer than two AMQP heartbeats loses the connection (the broker
drops it): harmless, its job is taken (its message comes back stale), and the run connects again.
"""
from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta


from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import is_connection_lost
from cronbox.outbox.core.logs import LimitedLines
from cronbox.outbox.core.text import clean_text, describe
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.run_loop import RunResult
from cronbox.outbox.amqp.broker import BrokerAddress
from cronbox.outbox.amqp.broker_loop import POLL_READY, BrokerLoop, DatabaseLost
from cronbox.outbox.amqp.consumer_link import Link
from cronbox.outbox.amqp.unreadable import Unreadable
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.forward_jobs import BrokerQueue
from cronbox.outbox.queue.job_messages import JobMessage, NotAJob, read, sent_again, shown_id
from cronbox.outbox.queue.job_family import JobStore, job_runner

log = logging.getLogger("cronbox")

HEARTBEAT = 60
UNKNOWN_HANDLER_WAIT = 60.0  # a job whose handler this worker lacks (another version's code) waits, no attempt used
NAME = "cronbox worker"
REFUSALS_LOGGED = 10  # WARNING lines a minute for refused or dropped messages; the rest are counted in one line


@dataclass
class BrokerWorkStats:
    stale: int = 0  # messages refused (stale or forged: jobstore.take's reasons): acked unrun
    bad: int = 0  # messages that are not job messages: dropped
    connects: int = 0
    not_here: list[str] = field(default_factory=list)  # handlers named by jobs this worker lacks


class BrokerReturns:
    """The job store's writes of a job's outcomes (outbox.queue.job_family.JobStore: results and
    idempotency keys kept as the settings say), but a job the worker took and gives back unstarted
    (the run stops) goes back to the broker as it came: reserved under its message's token
    (jobstore.untake, leased for its queue's republish_after as after a publish) for the message the
    worker then requeues (`given_back`), not ready for the next publish."""

    def __init__(self, republish_after: dict[str, float], settings):
        jobs = JobStore(settings)
        self.ack, self.give_up = jobs.ack, jobs.give_up
        self.reschedule, self.extend = jobs.reschedule, jobs.extend
        self.republish_after = republish_after  # queue -> seconds
        self.sent: dict[int, tuple[str, str]] = {}  # job id -> (its message's token, its queue), while taken here
        self.given_back: set[int] = set()  # job ids whose messages go back to the queue

    def release(self, session, ids, token, now):
        back = {job_id: self.sent[job_id] for job_id in ids if job_id in self.sent}
        released = jobstore.release(session, [job_id for job_id in ids if job_id not in back], token, now)
        for queue in {queue for _token, queue in back.values()}:
            lease = now + timedelta(seconds=self.republish_after[queue])
            released += jobstore.untake(session, {job_id: sent for job_id, (sent, q) in back.items() if q == queue},
                                        token, lease)
        self.given_back.update(back)
        return released


class BrokerWorker:
    """`amqp work`: the broker's messages taken as jobs (the claim source), run by the job runner."""

    def __init__(self, runtime, address: BrokerAddress, forwarded: list[BrokerQueue], *, prefetch: int = 10,
                 heartbeat_seconds: int = HEARTBEAT, stop_when_empty: bool = False):
        self.runtime = runtime
        self.registry = runtime.jobs
        self.queues = [f.name for f in forwarded]
        self.forwarded = forwarded
        self.names = ",".join(self.queues)
        broker_queues = tuple(dict.fromkeys(f.broker_queue for f in forwarded))
        self.link = Link(address, broker_queues[0], prefetch=prefetch, ordered=False, binds=[],
                         heartbeat_seconds=heartbeat_seconds, jobs=broker_queues, name=NAME)
        self.broker_stats = BrokerWorkStats()
        self.returns = BrokerReturns({f.name: f.republish_after for f in forwarded}, runtime.settings)
        self.runner = job_runner(runtime, self.returns)
        self.db = self.runner.db
        self.refusals = LimitedLines(log, f"amqp work: queues={self.names}: refused or dropped messages",
                                     per_window=REFUSALS_LOGGED)
        self._held = ExitStack()  # the database connection while messages flow (Runner.holding)
        self.loop = BrokerLoop(runtime, self.link, command="amqp work", detail=self.names, counts=self.counts,
                               run_inbound=self._run_inbound, connected=self._connected, release=self._at_rest,
                               sessions=lambda: self.db.sessions,  # the held connection's, while held
                               stop_when_empty=stop_when_empty)

    @property
    def stats(self):
        return self.runner.stats

    def counts(self) -> dict:
        return {"jobs_done": self.stats.done, "jobs_failed": self.stats.gave_up}

    def work(self, budget: Budget) -> RunResult:
        """Run the queues' jobs as their messages come, until the budget says stop (or, with
        stop_when_empty, nothing comes for a second): outbox.amqp.broker_loop."""
        try:
            return self.loop.run(budget)
        finally:
            self.refusals.flush(final=True)

    def _at_rest(self) -> None:
        """Idle or stopping: the held connection given back; the refusals left out of the log counted
        in a line once their minute is over."""
        self.refusals.flush()
        self._release_db()

    def _connected(self) -> str:
        self.broker_stats.connects += 1
        return f"queues {','.join(self.link.jobs)} (prefetch {self.link.prefetch})"

    # -- the messages read so far --------------------------------------------------
    def _run_inbound(self, budget: Budget) -> None:
        """Take and run the jobs of the messages read so far, on the connection held while messages
        flow (Runner.holding: profiles written when it is given back, not per message).
        In delivery order: consecutive job messages are taken together (one short transaction); a copy
        of a job a worker took and never finished alone; a message that is not a job message is
        dropped in its turn (its ack must not go out before the ones ahead of it: acks are multiple)."""
        # What the broker has sent already, up to the prefetch: one take (and one COMMIT) for them all.
        while len(self.link.inbound) < self.link.prefetch and self.link.readable():
            self.link.poll(POLL_READY)
        messages = list(self.link.inbound)
        self.link.inbound.clear()
        left: list[list] = []  # batches of (message, JobMessage or None: dropped)
        for message in messages:
            named = self._read(message)
            alone = named is None or sent_again(message)
            if alone or not left or left[-1][0][1] is None or sent_again(left[-1][0][0]):
                left.append([(message, named)])
            else:
                left[-1].append((message, named))
        try:
            if self.db.connection is None:  # held while messages flow, given back when idle (_release_db)
                self._held.enter_context(self.runner.holding())
            self.db.budget = budget
            first = True
            while left and (first or budget.stop_reason() is None):
                first = False
                self._run_batch(left, budget)
        except BaseException as exc:
            self._give_back(left)
            if is_connection_lost(exc):
                self._release_db()
                raise DatabaseLost(describe(getattr(exc, "orig", None) or exc, 200)) from exc
            raise
        self._give_back(left)  # the run stops: not taken, back to the queue (still valid: their rows are as sent)

    def _read(self, message) -> JobMessage | None:
        """The job a message names; None (logged; acked in its turn) if it is not a job message."""
        try:
            if isinstance(message, Unreadable):
                raise NotAJob("its properties cannot be read")
            return read(message.body)
        except NotAJob as bad:
            self.broker_stats.bad += 1
            self.refusals.log("amqp work: queues=%s message=%s dropped: %s", self.names, shown_id(message), bad)
            return None

    def _run_batch(self, left: list, budget: Budget) -> None:
        """Take the first batch of `left` and run what it took; its messages are acked once its jobs
        ran (or were released): the rows say the rest. A take that fails leaves the batch in `left`,
        to be given back to the queue."""
        batch = left[0]
        if batch[0][1] is None:  # not a job message: dropped in its turn
            left.pop(0)
            self.link.ack(batch[0][0].delivery_tag)
            return
        now = clock.utcnow()
        margin = self.runtime.settings.lease_margin
        named = [(job.job_id, job.claim_token) for _m, job in batch]
        take = self.db.transaction(lambda s: jobstore.take(s, self.registry, self.queues, named, now=now,
                                                         lease_margin=margin))
        left.pop(0)  # taken, refused or waiting elsewhere: from here its messages only need their acks (or requeue)
        for position, why in take.refused.items():
            message, job = batch[position]
            self.broker_stats.stale += 1
            self.refusals.log("amqp work: queues=%s message=%s job=%d refused: %s", self.names, shown_id(message, job),
                              job.job_id, clean_text(why, 200))
        for item in take.taken:
            self.returns.sent[item.id] = (named[take.taken_by[item.id]][1], item.queue)
        started = False
        try:
            for item in take.not_here:
                self._not_here(item)
            started = True
            if take.taken:
                self.runner.process(take.taken, budget)  # gives back what it does not start, also on an error
        except BaseException:
            if not started:
                self.runner.outcomes.release(take.taken, best_effort=True)
            raise
        finally:
            self._settle(batch, take)

    def _settle(self, batch: list, take: jobstore.Take) -> None:
        """The batch's messages, in delivery order: requeued if their job went back to the broker
        unstarted (BrokerReturns.release), else acked (the row says the rest)."""
        back = {position for job_id, position in take.taken_by.items() if job_id in self.returns.given_back}
        for job_id in take.taken_by:
            self.returns.sent.pop(job_id, None)
            self.returns.given_back.discard(job_id)
        try:
            for position, (message, _job) in enumerate(batch):
                if position in back:
                    self.link.give_back(message.delivery_tag)
                else:
                    self.link.ack(message.delivery_tag)
        except Exception:  # the connection gone (a long job outlived its heartbeats): they come back, stale
            self.link.close(graceful=False)

    def _give_back(self, batches: list) -> None:
        if not self.link.is_open:
            return
        for batch in batches:
            for message, _named in batch:
                try:
                    self.link.give_back(message.delivery_tag)
                except Exception:
                    self.link.close(graceful=False)  # they come back anyway once the channel is gone
                    return

    def _release_db(self) -> None:
        """Idle, stopping or failed: the held connection back to the pool, the profiles written."""
        try:
            self._held.close()
        except Exception as exc:  # a connection already gone: nothing to give back
            log.warning("amqp work: could not give back the database connection cleanly (%s)", describe(exc, 200))

    def _not_here(self, item) -> None:
        """A job whose handler this worker does not have (a worker running other code than the
        publisher's): ready again later, no attempt used, for a worker that has it (its outcome, as
        every other: outbox.engine.outcomes)."""
        self.runner.outcomes.not_runnable_here(
            item, UNKNOWN_HANDLER_WAIT, f"no handler {item.handler} is registered in the broker worker that took it")
        if item.handler not in self.broker_stats.not_here:
            self.broker_stats.not_here.append(item.handler)
