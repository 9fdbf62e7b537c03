"""The tick's job publisher: the due jobs of forwarded queues (outbox.queue.forward_jobs) to RabbitMQ.

Per forwarded queue and batch:
1. one short transaction claims what is due (jobstore.claim_to_publish): ready jobs get a new claim
   token each (their attempt is counted when a worker takes them), reserved ones whose lease ran out are
   sent again: under their token if no worker took them, else under a new one and flagged (a worker
   takes such a copy alone). Their lease is the publish's time (the confirm wait and
   CRONBOX_LEASE_MARGIN);
2. one message per job (outbox.queue.job_messages: id and token, no payload) is published with
   publisher confirms in one go (outbox.amqp.broker.Broker.send, the relay's client: py-amqp's
   basic_publish on a confirm channel; the queue declared durable first);
3. one transaction sets the lease of the confirmed ones to `republish_after` (a Celery task message's
   job is done instead: Celery has it), and of the failed ones
   (broker unreachable, no confirm in time) to PUBLISH_RETRY seconds, after which they are published
   again with the same token. A failed publish uses no attempt, and ends the pass (the tick goes on
   with its other stages).

A job is published before its row says so: a publisher killed between its claim and that last
transaction leaves the rows reserved, and they are published again when the short lease runs out
(a copy the broker did take is the same claim: it runs once). The publisher runs inside the tick,
under its lock, so no two publishers claim at once.
"""
from __future__ import annotations

import functools

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from cronbox.outbox.core import clock
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.logs import log_text
from cronbox.outbox.core.text import describe
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.amqp.broker import CONNECT_TIMEOUT, Broker
from cronbox.outbox.queue import celery_messages, job_messages, jobstore
from cronbox.outbox.queue.forward_jobs import CELERY, BrokerQueue

log = logging.getLogger("cronbox")

PUBLISH_TIMEOUT = 10.0  # seconds a batch may wait for its confirms (a job message is ~70 bytes)
PUBLISH_RETRY = 10.0  # seconds before a job whose publish failed is published again
BATCH = 500


@dataclass
class PublishStats:
    published: int = 0  # confirmed by the broker (first publish of a claim)
    republished: int = 0  # confirmed, published again under the same claim (lease ran out)
    failed: int = 0  # publishes not confirmed (tried again after PUBLISH_RETRY)


class JobPublisher:
    def __init__(self, runtime, *, batch_size: int = BATCH, before_batch: Callable[[], None] | None = None,
                 broker: Broker | None = None):
        self.runtime = runtime
        self.batch_size = batch_size
        self.before_batch = before_batch
        self._broker = broker
        self.stats = PublishStats()

    @property
    def broker(self) -> Broker:
        """The process's connection for jobs, made on the first batch."""
        if self._broker is None:
            self._broker = Broker(self.runtime.settings.get("CRONBOX_AMQP_URL"))
        return self._broker

    def close(self) -> None:
        if self._broker is not None:
            self._broker.close()

    def run(self, budget: Budget) -> int:
        """Publish until nothing is due or the budget says stop; returns the jobs published (or tried).
        An app without forwarded queues sends no statement."""
        forwarded = self.runtime.registry.broker_queues.in_order()
        if not forwarded:
            return 0
        if self._broker is not None:
            self._broker.keep_alive()  # each poll of the linger: heartbeats, a connection found dead
        total = 0
        while budget.stop_reason() is None:
            if self.before_batch is not None:
                self.before_batch()
            failed_before = self.stats.failed
            sent = sum(self._publish(queue, budget) for queue in forwarded)
            total += sent
            # Nothing due, or the broker failing (down, refusing a queue): no more claims this pass, so
            # a broker outage never keeps the tick from its other stages.
            if not sent or self.stats.failed > failed_before:
                break
        return total

    def _publish(self, forwarded: BrokerQueue, budget: Budget) -> int:
        wait = max(1.0, min(PUBLISH_TIMEOUT, budget.remaining() if budget.max_time is not None else PUBLISH_TIMEOUT))
        mode, jobs = self.runtime.claim_mode(), self.runtime.jobs

        def claim(session):
            now = clock.utcnow()
            lease_until = now + timedelta(seconds=wait + self.runtime.settings.lease_margin)
            return jobstore.claim_to_publish(session, jobs, forwarded.name, now=now, limit=self.batch_size, mode=mode,
                                             lease_until=lease_until)

        claimed, again, suspects = in_transaction(self.runtime.sessions, claim)
        items = again + claimed
        if not items:
            return 0
        make = (functools.partial(celery_messages.message_for, runtime=self.runtime) if forwarded.protocol == CELERY
                else job_messages.message_for)
        # A job a worker took and never finished may be what killed it: its copy is flagged, to be taken alone.
        messages = [make(forwarded.broker_queue, item, again=item.id in suspects) for item in items]
        try:
            self.broker.declare_queue(forwarded.broker_queue, min(CONNECT_TIMEOUT, wait))
        except Exception as exc:  # unreachable, or the queue refused: this batch fails, to be tried again
            results = [f"broker unreachable or queue {forwarded.broker_queue!r} refused ({self.broker.address!r}): "
                       f"{describe(exc, 300)}"] * len(items)
        else:
            results = self.broker.send(messages, wait)
        crash_point("after-publish-confirm")
        confirmed = [item for item, error in zip(items, results) if error is None]
        failed = [item for item, error in zip(items, results) if error is not None]

        def record(session):
            now = clock.utcnow()
            if forwarded.protocol == CELERY:  # Celery has it: from here its own retry rules apply
                jobstore.ack_published(session, confirmed, now)
            else:
                jobstore.published(session, confirmed, now + timedelta(seconds=forwarded.republish_after))
            jobstore.published(session, failed, now + timedelta(seconds=PUBLISH_RETRY))

        in_transaction(self.runtime.sessions, record)
        again_ids = {item.id for item in again}
        self.stats.republished += sum(1 for item in confirmed if item.id in again_ids)
        self.stats.published += sum(1 for item in confirmed if item.id not in again_ids)
        self.stats.failed += len(failed)
        if confirmed:
            log.info("jobs: published %d of queue %s to %s (%d again)", len(confirmed), forwarded.name,
                     forwarded.broker_queue, sum(1 for item in confirmed if item.id in again_ids))
        if failed:
            reason = next(error for error in results if error is not None)
            log.warning("jobs: %d of queue %s not published (%s); trying again in %.0fs", len(failed), forwarded.name,
                        log_text(reason), PUBLISH_RETRY)
        return len(items)
