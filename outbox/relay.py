"""The relay: fan events out to consumers, claim due deliveries, call consumers in-process.

Where a delivery goes is this module's `_deliver` (today: a Python function in
this process). A transport that publishes to a broker instead would replace
that one method; claiming, leases and retries stay as they are.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from . import clock, deliveries
from .budget import Budget
from .consumers import Consumer
from .context import Context, Event
from .db import in_transaction, session_factory
from .execution import PERMANENT, RETRY_LATER, TIMEOUT, Outcome, call_handler, describe
from .faults import crash_point
from .payload import load_payload

log = logging.getLogger("cronbox")

FAN_OUT_BATCH = 500


@dataclass
class RelayStats:
    fanned: int = 0
    delivered: int = 0
    retried: int = 0
    deferred: int = 0
    dead: int = 0
    lease_lost: int = 0

    def add(self, other: "RelayStats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Relay:
    def __init__(self, runtime, *, batch_size: int = 100, before_batch: Callable[[], None] | None = None):
        self.runtime = runtime
        self.sessions = runtime.sessions
        self.registry = runtime.consumers
        self.batch_size = batch_size
        self.before_batch = before_batch
        self.stats = RelayStats()
        self._warned: set[str] = set()

    def run(self, budget: Budget) -> int:
        """Relay until nothing is due or the budget says stop; returns deliveries handled + events fanned out.

        One pooled connection is held for the round (never a transaction across
        handlers): every checkout would otherwise cost a pre-ping and a reset
        ROLLBACK, two round trips per delivery.
        """
        self.runtime.claim_mode()  # may ask the server its version: before we hold the only connection
        with self.runtime.engine.connect() as connection:
            self.sessions = session_factory(connection)
            try:
                return self._run(budget)
            finally:
                self.sessions = self.runtime.sessions

    def _run(self, budget: Budget) -> int:
        work = 0
        self._warn_unregistered()
        while budget.stop_reason() is None:
            if self.before_batch is not None:
                self.before_batch()  # e.g. RunLock.check: raises LockLost
            fanned = self.fan_out()
            claimed = self.claim(budget.batch_size(self.batch_size))
            if not claimed and not fanned:
                break
            work += fanned + self.process(claimed, budget)
        return work

    def fan_out(self) -> int:
        now = clock.utcnow()
        events, rows = in_transaction(
            self.sessions, lambda s: deliveries.fan_out(s, self.registry, now, FAN_OUT_BATCH)
        )
        self.stats.fanned += events
        return events

    def claim(self, limit: int) -> list[deliveries.Claimed]:
        mode = self.runtime.claim_mode()
        margin = self.runtime.settings.lease_margin
        return in_transaction(
            self.sessions,
            lambda s: deliveries.claim_due(s, self.registry, now=clock.utcnow(), limit=limit, mode=mode,
                                           lease_margin=margin),
        )

    def process(self, claimed: list[deliveries.Claimed], budget: Budget) -> int:
        quiet_acks: list[deliveries.Claimed] = []  # handlers that wrote nothing: acked together
        handled = 0
        for index, item in enumerate(claimed):
            if index and budget.stop_reason() is not None:
                self._release(claimed[index:])
                break
            try:
                self._deliver(item, quiet_acks, budget)
            except BaseException:
                # Database gone, or a signal: ack what finished, give back what never started.
                self._flush(quiet_acks, best_effort=True)
                self._release(claimed[index + 1:], best_effort=True)
                raise
            handled += 1
        self._flush(quiet_acks)
        return handled

    # -- one delivery -------------------------------------------------------------

    def _deliver(self, item: deliveries.Claimed, quiet_acks: list, budget: Budget) -> None:
        consumer = self.registry.get(item.consumer)
        if consumer is None:  # unregistered since the claim: give the lease back
            self._release([item])
            return
        if item.attempts > consumer.max_attempts:
            self._kill(item, consumer, f"gave up: attempt {item.attempts - 1} of {consumer.max_attempts} was claimed "
                                       "but never finished (process killed or lease expired)")
            return
        crash_point("after-claim")
        event = Event(item.event_id, item.event_type, item.key, load_payload(item.payload), item.created_at)
        ctx = Context(attempt=item.attempts, trace_id=item.trace_id, idempotency_key=f"delivery-{item.id}",
                      sessions=self.sessions)
        outcome = call_handler(consumer.fn, (event, ctx), timeout=consumer.timeout)
        budget.record(outcome.seconds)
        if outcome.ok and not ctx.session_used:
            quiet_acks.append(item)
            return
        if outcome.ok:
            outcome = self._ack_with_session(item, consumer, ctx, outcome)
            if outcome.ok:
                return
        else:
            ctx.discard_session(invalidate=outcome.kind == TIMEOUT)
        self._fail(item, consumer, outcome)

    def _ack_with_session(self, item, consumer: Consumer, ctx: Context, outcome: Outcome) -> Outcome:
        """Commit the consumer's writes and its ack together, or neither."""
        try:
            if deliveries.ack(ctx.session, [item.id], item.claim_token, clock.utcnow()) != 1:
                ctx.discard_session()
                self.stats.lease_lost += 1
                self._log(item, consumer, "lease-lost", outcome, "lease expired before the ack; rolled back")
                return outcome
            crash_point("before-ack-commit")
            ctx.session.commit()
            crash_point("after-ack-commit")
        except Exception as exc:  # the consumer's writes failed at commit (constraint, conflict): a failed attempt
            ctx.discard_session(invalidate=True)
            return Outcome("error", outcome.seconds, f"commit failed: {describe(exc)}")
        finally:
            ctx.close()
        self.stats.delivered += 1
        self._log(item, consumer, "done", outcome)
        return outcome

    def _flush(self, quiet_acks: list[deliveries.Claimed], *, best_effort: bool = False) -> None:
        if not quiet_acks:
            return
        crash_point("before-ack-commit")
        token = quiet_acks[0].claim_token
        ids = [item.id for item in quiet_acks]
        try:
            acked = in_transaction(self.sessions, lambda s: deliveries.ack(s, ids, token, clock.utcnow()))
        except Exception:
            if not best_effort:
                raise
            log.warning("relay: could not ack %d finished deliveries; they will be delivered again", len(ids))
            return
        crash_point("after-ack-commit")
        self.stats.delivered += acked
        self.stats.lease_lost += len(ids) - acked
        for item in quiet_acks:
            consumer = self.registry.get(item.consumer)
            self._log(item, consumer, "done", None)
        if acked != len(ids):
            log.warning("relay: %d of %d acks found their lease expired (another run may deliver again)",
                        len(ids) - acked, len(ids))

    def _fail(self, item, consumer: Consumer, outcome: Outcome) -> None:
        now = clock.utcnow()
        if outcome.kind == RETRY_LATER:
            next_at = now + timedelta(seconds=outcome.retry_in or 0)
            in_transaction(self.sessions, lambda s: deliveries.reschedule(
                s, item.id, item.claim_token, next_at=next_at, error=None, refund_attempt=True))
            self.stats.deferred += 1
            self._log(item, consumer, "retry-later", outcome)
            return
        if outcome.kind == PERMANENT or item.attempts >= consumer.max_attempts:
            self._kill(item, consumer, outcome.error or "failed")
            return
        next_at = now + timedelta(seconds=consumer.backoff.delay(item.attempts))
        in_transaction(self.sessions, lambda s: deliveries.reschedule(
            s, item.id, item.claim_token, next_at=next_at, error=outcome.error))
        self.stats.retried += 1
        self._log(item, consumer, "retry", outcome, f"next in {(next_at - now).total_seconds():.0f}s")

    def _kill(self, item, consumer: Consumer, error: str) -> None:
        in_transaction(self.sessions, lambda s: deliveries.kill(s, item.id, item.claim_token, error=error,
                                                                now=clock.utcnow()))
        self.stats.dead += 1
        log.error("delivery=%s outcome=dead consumer=%s event=%s type=%s attempt=%s/%s trace=%s error=%s",
                  item.id, consumer.name, item.event_id, item.event_type, item.attempts, consumer.max_attempts,
                  item.trace_id, error[:300])

    def _release(self, items: list[deliveries.Claimed], *, best_effort: bool = False) -> None:
        if not items:
            return
        token = items[0].claim_token
        try:
            released = in_transaction(self.sessions, lambda s: deliveries.release(s, [i.id for i in items], token))
        except Exception:
            if not best_effort:
                raise
            log.warning("relay: could not release %d claimed deliveries; their leases will expire", len(items))
            return
        log.info("relay: released %d claimed deliveries not started", released)

    def _log(self, item, consumer, outcome_name: str, outcome: Outcome | None, note: str | None = None) -> None:
        ms = f"{outcome.seconds * 1000:.1f}" if outcome else "-"
        line = (f"delivery={item.id} outcome={outcome_name} consumer={item.consumer} event={item.event_id} "
                f"type={item.event_type} attempt={item.attempts}/{consumer.max_attempts if consumer else '?'} "
                f"trace={item.trace_id} ms={ms}")
        if outcome is not None and outcome.error:
            line += f" error={outcome.error[:300]!r}"
        if note:
            line += f" ({note})"
        (log.warning if outcome_name not in ("done",) else log.info)(line)

    def _warn_unregistered(self) -> None:
        rows = in_transaction(self.sessions, lambda s: deliveries.unregistered_due(s, self.registry, clock.utcnow()))
        for name, count in rows:
            if name not in self._warned:
                self._warned.add(name)
                log.warning("relay: %d due deliveries for consumer %r, which is not registered in this process "
                            "(check CRONBOX_HANDLERS); they wait", count, name)
