"""The relay: fan events out to consumers, claim due deliveries, call consumers in-process or
forward them to a broker.

A claimed batch splits in two. Deliveries of in-process consumers run one by one through the
Processor (a Python function per delivery). Deliveries of forward targets (outbox.forward) are
published per target as one batch with publisher confirms (outbox.events.broker); each one is then
acked if the broker confirmed it, or retried with the target's backoff. Claiming, leases, per-key
order and retries are the same for both: a claim takes at most one delivery per (consumer, key),
so a message that failed stays pending and holds its key back until it gets through. Each batch
is one transaction: the claim of what is due, then the fan-out of new events, which inserts the
forward targets' new deliveries already leased (up to the rest of the batch; those a claim would
take at once: deliveries.fan_out), so a fresh forwarded event needs no claim statement; keyless ones
are not even written as rows until their outcome is known (outbox.events.flights). A claim that
found nothing is skipped for a second while fresh events keep coming (_claim_wanted).

Forwarded batches are pipelined one deep: batch N is published, and while its confirms come in the
relay settles N-1 and fans out and claims N+1; N's confirms are collected just before N+1 is
published. Settling N-1 reschedules its failed deliveries at once, and leaves its confirmed ones to
the transaction of N+1's claim and fan-out, which acks them first (one COMMIT a batch, not two: on
MySQL each is a flush of the redo log). Nothing is acked before its confirm, and the claim of N+1
cannot take a later delivery of a key N carries: N's deliveries are still pending, so they hold
their keys. N is settled, and the confirmed deliveries acked in a transaction of their own, when it
failed outright (broker unreachable), when its leases run out, before in-process handlers run, and
at the end of the run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, TypeVar

from outbox.core import clock
from outbox.core.faults import crash_point
from outbox.core.payload import load_payload
from outbox.core.text import clean_text, describe
from outbox.engine.budget import Budget
from outbox.engine.context import Context, Event
from outbox.engine.handler_call import ERROR, Outcome
from outbox.engine.processor import Processor
from outbox.events import deliveries, placement
from outbox.events.broker import Broker, InFlight, Outgoing
from outbox.events.forward import ForwardTarget, is_forward, message_of

log = logging.getLogger("cronbox")
T = TypeVar("T")

FAN_OUT_BATCH = 500
CLAIM_EVERY = 1.0  # seconds between claims that find nothing, while fan-outs keep a run busy (_claim_wanted)
MAX_ROUTING_KEY = 255  # an AMQP short string


FAN_OUT_RACES = 5  # fan-out transactions tried in a row while another relay keeps fanning out the same events


def _racing(transaction: Callable[[], T]) -> T:
    """Run `transaction` again when another relay fanned out the same events under it
    (deliveries.FanOutRace, rolled back): its next read sees the other's COMMIT. Bounded: relays
    that keep colliding raise, and the run ends with the error as on any database failure."""
    for attempt in range(1, FAN_OUT_RACES + 1):
        try:
            return transaction()
        except deliveries.FanOutRace as race:
            if attempt == FAN_OUT_RACES:
                raise
            log.info("relay: %s; fanning out again (%d/%d)", race, attempt, FAN_OUT_RACES - 1)
    raise AssertionError("unreachable")


@dataclass
class Forwarded:
    """A target's batch published and not yet settled."""
    target: ForwardTarget
    items: list
    flight: InFlight
    started: float  # monotonic, when publishing began
    budget: Budget
    leases_until: datetime  # the earliest lease among the items
    unsent: list  # (flight item, error) never published (its routing key failed): settled with the rest


class Relay(Processor):
    kind = "delivery"
    gave_up_word = "dead"
    store = deliveries

    def __init__(self, runtime, *, batch_size: int = 100, before_batch: Callable[[], None] | None = None,
                 broker: Broker | None = None):
        super().__init__(runtime)
        placement.check(runtime.consumers)  # an event must not reach a consumer from here and the broker both
        self.registry = runtime.consumers
        self.batch_size = batch_size
        self.before_batch = before_batch
        self._warned: set[str] = set()
        self._broker = broker
        self._in_flight: Forwarded | None = None
        # Confirmed by the broker, not yet acked: the next claim's transaction acks them (_settle_sent).
        self._confirmed: list = []
        self._claim_next = True  # _claim_wanted
        self._next_claim_at = 0.0

    @property
    def broker(self) -> Broker:
        """The process's broker connection, made on the first forwarded batch."""
        if self._broker is None:
            self._broker = Broker(self.runtime.settings.get("CRONBOX_AMQP_URL"))
        return self._broker

    def close(self) -> None:
        """At the end of the run: close the broker connection, if one was opened."""
        if self._broker is not None:
            self._broker.close()

    def run(self, budget: Budget) -> int:
        """Relay until nothing is due or the budget says stop; returns deliveries handled + events fanned out."""
        return self.on_one_connection(lambda: self._run(budget))

    def _run(self, budget: Budget) -> int:
        self._budget = budget  # the claims' lock waits and retries end with the run (Processor._transaction)
        work = 0
        self._claim_next = True  # a run's first transaction claims (the relay lives through a linger's polls)
        self._warn_unregistered()
        if self._broker is not None:
            self._broker.keep_alive()  # each poll of the linger: heartbeats, a connection found dead
        try:
            while budget.stop_reason() is None:
                if self.before_batch is not None:
                    self.before_batch()  # e.g. RunLock.check: raises LockLost
                # While a forwarded batch is in flight, its confirms come in during this claim and
                # fan-out: neither takes a later delivery of a key in flight (its delivery is still
                # pending, so it holds the key), and nothing is acked here.
                if self._in_flight is not None and self._in_flight.leases_until <= clock.utcnow():
                    self._settle_sent(self._collect())  # its leases ran out: the claim would take it again
                fanned, claimed = self.claim_and_fan_out(budget.batch_size(self.batch_size))
                if not claimed and not fanned:
                    if self._in_flight is None:
                        break
                    self._settle_sent(self._collect())  # frees its keys' next deliveries: claim again
                    continue
                work += fanned + self.process(claimed, budget)
        except BaseException:
            self._settle_sent(self._collect(), best_effort=True)
            raise
        self._settle_sent(self._collect())
        return work

    def fan_out(self) -> int:
        now = clock.utcnow()
        events, _rows, _leased = _racing(lambda: self._transaction(
            lambda s: deliveries.fan_out(s, self.registry, now, FAN_OUT_BATCH)))
        self.stats.fanned += events
        return events

    def claim_and_fan_out(self, limit: int) -> tuple[int, list[deliveries.Claimed]]:
        """One transaction: ack the forwarded deliveries confirmed since the last one, claim what
        is due (up to `limit`), then fan out new events, inserting up to the rest of `limit` of the
        forward targets' new deliveries already leased to this run (deliveries.fan_out's `lease`):
        a fresh forwarded event costs no claim statement. Claimed first, so retries and deliveries
        left from earlier fan-outs keep going first (oldest first, as the claim orders them), and
        nothing joins an expired lease, claimed alone. The acks come before the claim, as they did
        when they committed on their own just before it: a key whose delivery is acked here is free
        for the claim. Returns (events fanned out, the claimed deliveries)."""
        mode = self.runtime.claim_mode()
        margin = self.runtime.settings.lease_margin
        targets = [c for c in self.registry.all() if is_forward(c)]

        def step(session, confirmed, claim):
            now = clock.utcnow()
            acked = self._ack(session, confirmed, now) if confirmed else 0
            claimed, expired = deliveries.claim_due_or_expired(
                session, self.registry, now=now, limit=limit, mode=mode, lease_margin=margin) if claim else ([], False)
            rest = 0 if expired else limit - len(claimed)
            lease = deliveries.Lease.new(targets, now, margin, rest) if targets and rest > 0 else None
            events, rows, leased = deliveries.fan_out(session, self.registry, now, FAN_OUT_BATCH, lease=lease)
            if confirmed:
                crash_point("before-ack-commit")
            return events, claimed, leased, rows - len(leased), acked

        claim = self._claim_wanted()
        while True:
            confirmed = self._confirmed
            events, claimed, leased, waiting, acked = _racing(lambda: self._transaction(
                lambda s: step(s, confirmed, claim)))
            if confirmed:
                crash_point("after-ack-commit")
                self._confirmed = []
                self._acked(confirmed, acked)
            self.stats.fanned += events
            if claim:
                self._next_claim_at = clock.monotonic() + CLAIM_EVERY
            # Claim again next time if this one found work (there may be more), or the fan-out left
            # rows a claim is to take (in-process consumers', held keys', those past the lease limit).
            self._claim_next = bool(claimed) or waiting > 0
            if claim or events:
                return events, claimed + leased
            claim = True  # no new events: look for due work before the run concludes there is none

    def _claim_wanted(self) -> bool:
        """Does this batch's transaction claim? A claim that found nothing is not repeated for
        CLAIM_EVERY seconds while fresh events keep coming (each costs a few statements and reads the
        pending rows' indexes: a fifth of forwarding's time when every batch claimed), unless
        something since may have made a row claimable: a row left by a fan-out, a claim that found
        work, an ack or release of rows (it frees their keys). Rows that come due meanwhile (retries,
        another run's expired leases, an operator's retry) wait at most that long; the run's first
        transaction, and one that finds no new events, always claim."""
        if self._claim_next or clock.monotonic() >= self._next_claim_at:
            return True
        return any(not item.flight for item in self._confirmed)

    def process(self, claimed: list, budget: Budget) -> int:
        forwarded = [item for item in claimed if is_forward(self.registry.get(item.consumer))]
        local = [item for item in claimed if not is_forward(self.registry.get(item.consumer))]
        try:
            if forwarded:
                self._forward(forwarded, budget)
            if local:
                self._claim_next = True  # their acks free their keys
                # Handlers may run long: the batch in flight is settled first, within its leases.
                self._settle_sent(self._collect())
        except BaseException:
            self._release(local, best_effort=True)
            raise
        return len(forwarded) + (super().process(local, budget) if local else 0)

    # -- forwarding ----------------------------------------------------------------
    # One batch per target is in flight at a time: published, its confirms collected just before
    # the next batch is published, and settled (acked / rescheduled) just after, so the broker's
    # confirm latency overlaps the database work (this settle, the next fan-out and claim).

    def _forward(self, items: list, budget: Budget) -> None:
        """Publish each target's deliveries as one confirmed batch: a target whose exchange is
        missing (the broker closes the channel) fails alone, not every other target's batch."""
        groups: dict[str, list] = {}
        for item in items:
            groups.setdefault(item.consumer, []).append(item)
        names = list(groups)
        for index, name in enumerate(names):
            if index and budget.stop_reason() is not None:
                self._release([i for n in names[index:] for i in groups[n]])
                break
            self._publish(self.registry.get(name), groups[name], budget)

    def _publish(self, target: ForwardTarget, items: list, budget: Budget) -> None:
        live, messages, unsent = [], [], []
        covered = clock.utcnow() + timedelta(seconds=target.timeout)  # a lease past this needs no extending
        flights_covered: dict[str, bool] = {}  # a flight has one lease: extended once for all its deliveries
        for item in items:
            if item.lease_until < covered:
                if not item.flight:
                    if not self._lease_covers(item, target):
                        continue
                elif item.claim_token not in flights_covered:
                    flights_covered[item.claim_token] = self._lease_covers(item, target)
                    if not flights_covered[item.claim_token]:
                        continue  # grounded by another run: what it stands for is that run's now
                elif not flights_covered[item.claim_token]:
                    self.stats.lease_lost += 1  # as _lease_covers counted the first of them
                    continue
            if item.attempts > target.max_attempts:
                self._give_up(item, target, Outcome(
                    "exhausted", 0.0, f"gave up: attempt {item.attempts - 1} of {target.max_attempts} was claimed "
                                      "but never finished (process killed or lease expired)"))
                continue
            try:
                messages.append(self._message(target, item))
            except Exception as exc:  # a routing_key function that raised, or a payload it could not read
                error = f"no routing key: {describe(exc, 900)}"
                if item.flight:
                    unsent.append((item, error))  # written when its flight lands, with the others
                else:
                    self._after_failure(item, target, Outcome(ERROR, 0.0, error))
                continue
            live.append(item)
        if not live:
            self._land_failed(target, [(i, e, 0.0) for i, e in unsent])
            return
        crash_point("after-claim")
        # Another target's confirmed deliveries (this is the second target of a claimed batch) are
        # acked now: left to the next claim, they would wait on this collect and publish too.
        self._flush_confirmed()
        previous = self._collect()
        started = clock.monotonic()
        # Never past the run's end: the tick must exit by --max-time even if the broker stalls.
        wait = max(1.0, min(target.timeout, budget.remaining() if budget.max_time is not None else target.timeout))
        flight = self.broker.publish(messages, wait)
        self._in_flight = Forwarded(target, live, flight, started, budget, min(i.lease_until for i in live), unsent)
        self._settle_sent(previous, ack_later=True)  # the next claim_and_fan_out acks its confirmed ones
        if flight.results is not None:  # failed already (broker unreachable): settle it now, within its leases
            self._settle_sent(self._collect())

    @staticmethod
    def _message(target: ForwardTarget, item) -> Outgoing:
        # A routing-key function sees the event as a consumer would; a fixed key needs no parse.
        routing_key = target.target.routing_key
        if routing_key is None:
            key = item.event_type
        elif isinstance(routing_key, str):
            key = routing_key
        else:
            key = target.target.key_for(Event(item.event_id, item.event_type, item.key, load_payload(item.payload),
                                              item.created_at))
        if len(key.encode("utf-8", "surrogatepass")) > MAX_ROUTING_KEY:
            raise ValueError(f"the routing key is longer than AMQP's {MAX_ROUTING_KEY} bytes: {key[:40]!r}...")
        return message_of(target.target.exchange, key, item)

    def _collect(self) -> tuple[Forwarded, list[str | None], float] | None:
        """Wait for the confirms of the batch in flight, if any: (it, results, seconds it took)."""
        forwarded, self._in_flight = self._in_flight, None
        if forwarded is None:
            return None
        results = self.broker.collect(forwarded.flight)
        return forwarded, results, clock.monotonic() - forwarded.started

    def _settle_sent(self, collected, *, best_effort: bool = False, ack_later: bool = False) -> None:
        """Ack the confirmed deliveries of a collected batch (with any left from earlier batches),
        reschedule the rest. `ack_later`: leave the acks to the next claim_and_fan_out's
        transaction, which follows at once (within the leases, as an ack of its own would)."""
        failed_flights = []
        if collected is not None:
            forwarded, results, took = collected
            target, live = forwarded.target, forwarded.items
            seconds = took / len(live)
            for _ in live:
                forwarded.budget.record(seconds)
            # A flight lands whole, in one transaction: with its confirmed deliveries in the next
            # claim's (as rows are acked) when nothing of it failed, else now.
            failing = {i.claim_token for i, error in zip(live, results) if error is not None and i.flight}
            failing.update(i.claim_token for i, _ in forwarded.unsent)
            self._confirmed.extend(item for item, error in zip(live, results)
                                   if error is None and not (item.flight and item.claim_token in failing))
            failed_flights = [(i, e, seconds) for i, e in zip(live, results) if i.flight and i.claim_token in failing]
            failed_flights += [(i, e, 0.0) for i, e in forwarded.unsent]
        try:
            if not ack_later:
                self._flush_confirmed()  # first: the broker has these, the sooner acked the fewer duplicates
            if collected is not None:
                for item, error in zip(live, results):
                    if error is not None and not item.flight:
                        self._after_failure(item, target, Outcome(ERROR, seconds, error))
                self._land_failed(target, failed_flights)
        except Exception:
            if not best_effort:
                raise
            failed = (sum(1 for i, error in zip(live, results) if error is not None and not i.flight)
                      + len(failed_flights)) if collected is not None else 0
            log.warning("relay: could not record the outcome of %d forwarded deliveries; their leases will "
                        "expire and they are published again", len(self._confirmed) + failed)
            self._confirmed = []

    def _flush_confirmed(self) -> None:
        """Ack the confirmed deliveries waiting in self._confirmed, in a transaction of their own."""
        confirmed = self._confirmed
        if not confirmed:
            return
        crash_point("before-ack-commit")
        acked = self._transaction(lambda s: self._ack(s, confirmed, clock.utcnow()))
        crash_point("after-ack-commit")
        self._confirmed = []
        self._claim_next = self._claim_next or any(not item.flight for item in confirmed)
        self._acked(confirmed, acked)

    # -- flights (outbox.events.flights): keyless deliveries whose rows are written once settled --

    def _land_failed(self, target: ForwardTarget, outcomes: list) -> None:
        """Land the flights of `outcomes` ((item, error or None, seconds) of every member of each):
        the confirmed ones done, the failed ones retrying with the target's backoff (attempt 1 was
        theirs) or dead, as Processor._after_failure decides for rows, in one transaction a flight;
        then their counters and log lines."""
        by_flight: dict[str, list] = {}
        for outcome in outcomes:
            by_flight.setdefault(outcome[0].claim_token, []).append(outcome)
        for token, members in by_flight.items():
            now = clock.utcnow()
            done, failed = [], []
            for item, error, seconds in members:
                if error is None:
                    done.append(item)
                    continue
                outcome = Outcome(ERROR, seconds, error)
                failed.append((item, outcome, self._retry_at(item, target, outcome, now)))
            landing = deliveries.Landing([i.event_id for i in done],
                                         [(i.event_id, next_at, o.error) for i, o, next_at in failed], [])
            if not self._transaction(lambda s: deliveries.land_flight(s, token, target.name, landing, now)):
                self._flight_lost(target, [m[0] for m in members])
                continue
            self._acked(done, len(done))
            for item, outcome, next_at in failed:
                if next_at is None:
                    self._gave_up(item, target, outcome)
                else:
                    self._retried(item, target, outcome, next_at, now)

    def _flight_lost(self, target: ForwardTarget, items: list) -> None:
        self.stats.lease_lost += len(items)
        log.warning("relay: the flight of %d deliveries to %s ran out of its lease before it landed; another "
                    "run published them again or will (same message ids), this outcome is not recorded",
                    len(items), target.name)

    def _ack(self, session, items: list, now: datetime) -> int:
        """Rows acked as Processor._ack does; the confirmed deliveries of a flight written done as
        the flight lands (all of a flight's deliveries are confirmed here: one that failed lands
        the flight at once, _land_failed)."""
        rows = [item for item in items if not item.flight]
        acked = super()._ack(session, rows, now) if rows else 0
        by_flight: dict[tuple[str, str], list[int]] = {}
        for item in items:
            if item.flight:
                by_flight.setdefault((item.claim_token, item.consumer), []).append(item.event_id)
        for (token, consumer), event_ids in by_flight.items():
            if deliveries.land_flight(session, token, consumer, deliveries.Landing(event_ids, [], []), now):
                acked += len(event_ids)
        return acked

    def _release(self, items: list, *, best_effort: bool = False) -> None:
        """Give back what was claimed but not started: rows as Processor._release does (per claim
        token), a flight's deliveries written as pending rows, their attempt not counted."""
        self._claim_next = True  # claimable again
        by_lease: dict[tuple[str, bool], list] = {}  # a fan-out's keyed rows and its flight share a token
        for item in items:
            by_lease.setdefault((item.claim_token, item.flight), []).append(item)
        for (token, flight), members in by_lease.items():
            if not flight:
                super()._release(members, best_effort=best_effort)
                continue
            consumer = members[0].consumer
            landing = deliveries.Landing([], [], [i.event_id for i in members])
            try:
                landed = self._transaction(lambda s: deliveries.land_flight(
                    s, token, consumer, landing, clock.utcnow()))
            except Exception:
                if not best_effort:
                    raise
                log.warning("relay: could not release a flight of %d deliveries; its lease will expire", len(members))
                continue
            if landed:
                log.info("relay: released %d claimed but not started", len(members))

    # -- Processor hooks -----------------------------------------------------------
    def _handler(self, item):
        return self.registry.get(item.consumer)

    def _args(self, item, ctx: Context) -> tuple:
        return (Event(item.event_id, item.event_type, item.key, load_payload(item.payload), item.created_at), ctx)

    def _describe(self, item) -> str:
        # A flight's delivery has no row id when it is logged (its row is written as it lands).
        return (f"delivery={item.id if item.id is not None else '-'} consumer={item.consumer} "
                f"event={item.event_id} type={clean_text(item.event_type, 191)}")

    def _warn_unregistered(self) -> None:
        rows = self._transaction(lambda s: deliveries.unregistered_due(s, self.registry, clock.utcnow()))
        for name, count in rows:
            if name not in self._warned:
                self._warned.add(name)
                log.warning("relay: %d due deliveries for consumer %r, which is not registered in this process "
                            "(check CRONBOX_HANDLERS); they wait", count, name)
