"""Running the registered consumers off a RabbitMQ queue: `python -m cronbox amqp consume --queue Q`.

Per message (the relay's forward targets publish them: outbox.events.forward.message_properties):
1. check it (outbox.events.incoming): a body over MAX_BODY bytes, no or an oversized message_id, no
   type, a type no consumer here is registered for, or a body that is not JSON is a bad message:
   parked in Q.dead with the reason, acked, and the queue goes on;
2. for each consumer registered for its type (forward targets excluded), in its own transaction on
   cronbox's connection: `inbox.take_first()` writes the (consumer, message_id) row as its first
   statement (a copy already handled finds it: that consumer is skipped), the handler runs
   through `call_handler` (timeout, outcome, safe error text) inside the host app's scope
   (`runtime.scope_for`), then one COMMIT holds the handler's writes and the inbox row, or a
   rollback neither (outbox.engine.settle, the step every handler's writes take). The handler's session joins that transaction without a SAVEPOINT (one
   statement less per message); should its rollback() take the inbox row with it, the row is
   written again after the handler (_take_again);
3. only then the broker ack: one `basic.ack multiple` for the messages handled in a row (consumer_link.Link.ack
   says when it goes out; a crash before it only brings them again, and the inbox skips them). A failure is republished first (publisher confirm) and acked after:
   - retried: to `Q.retry.<ms>ms` with the attempt header raised; its TTL dead-letters it back to
     Q (outbox.events.queues). A retry re-runs only the consumers that did not commit: the others
     find their inbox row;
   - `RetryLater(seconds)`: the same, without an attempt (queues.retry_later_delay says which queue);
   - parked in Q.dead when a consumer raised PermanentFailure or used its max_attempts.
   With several failing consumers the message waits the shortest of their delays.
   `ordered`: the queue has a single active consumer, prefetch 1, and a failure waits its delay
   holding the message (heartbeats serviced), so nothing later overtakes it.
0. before all that, a delivery the broker flags `redelivered` (it came back unacked: the process
   died or its connection did with it in hand) is republished to the back of Q with
   `x-cronbox-redeliveries` raised and acked, or parked once that reaches max_redeliveries (a
   poison message; _requeue_redelivered). Not in `ordered` mode, where a republish would break the
   order: there the count is kept in the database (outbox.events.redeliveries) and the message is
   handled in place, or parked once the count reaches max_redeliveries (_park_if_poison).
   A clean stop (--max-time, --max-messages, SIGTERM) must not feed that count: the messages read
   ahead and not started are republished unchanged and acked, not flagged (Link.return_read_ahead;
   not in `ordered` mode, where the one the broker may have sent after the last ack still goes back
   flagged and counts once, forgotten when it is finished).

The broker connection (outbox.amqp.consumer_link; one, named "cronbox consumer", AMQP heartbeats serviced between messages and
while idle) is dropped on any error and opened again with backoff until the run's end; unacked
messages go back to the queue and come again, where the inbox keeps their effects to once. Between
messages SIGTERM/SIGINT stop the loop (outbox.engine.run_loop.StopSignals): the message being
handled is finished, committed and acked first. The database connection is held while messages
flow and given back when the queue is idle (MySQL kills connections idle past wait_timeout).
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import CONNECTION_ERRORS, is_connection_lost
from cronbox.outbox.core.engines import session_factory
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.logs import log_text
from cronbox.outbox.core.text import NAME_MAX, clean_text, describe
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.context import Context
from cronbox.outbox.engine.handler_call import PERMANENT, RETRY_LATER, TIMEOUT, Outcome, call_handler
from cronbox.outbox.engine.outcomes import last_attempt
from cronbox.outbox.engine.settle import settle
from cronbox.outbox.engine.run_loop import RunResult
from cronbox.outbox.events import inbox, placement, queues, redeliveries
from cronbox.outbox.amqp.broker_loop import POLL, BrokerLoop, DatabaseLost
from cronbox.outbox.amqp.broker import BrokerAddress
from cronbox.outbox.amqp.consumer_link import Link
from cronbox.outbox.events.incoming import BadMessage, Incoming, headers_of, parse, trace_id_of
from cronbox.outbox.amqp.unreadable import RAW_PROPERTIES, Unreadable

log = logging.getLogger("cronbox")

HEARTBEAT = 60  # seconds, the AMQP heartbeat asked of the broker (keep handler timeouts below it)
DUPLICATE = "duplicate"  # a consumer that had handled the message already


@dataclass
class ConsumeStats:
    done: int = 0  # every consumer committed (or had already)
    duplicates: int = 0  # messages every consumer of which had handled before
    retried: int = 0
    deferred: int = 0  # RetryLater: waiting again, no attempt used
    parked: int = 0  # Q.dead: failures and bad messages
    bad: int = 0
    connects: int = 0

    def counts(self) -> dict:
        return {"delivered": self.done, "retried": self.retried + self.deferred, "dead": self.parked}


class QueueConsumer:
    def __init__(self, runtime, address: BrokerAddress, queue: str, *, prefetch: int = 10, ordered: bool = False,
                 binds: list[tuple[str, str]] | None = None, heartbeat_seconds: int = HEARTBEAT,
                 max_redeliveries: int = queues.MAX_REDELIVERIES):
        placement.check(runtime.consumers)  # an event must not reach a consumer from here and the tick both
        self.runtime = runtime
        self.max_redeliveries = max_redeliveries
        self.queue = queue
        self.ordered = ordered
        self.link = Link(address, queue, prefetch=1 if ordered else prefetch, ordered=ordered, binds=binds or [],
                         heartbeat_seconds=heartbeat_seconds, beside=(queues.dead_queue(queue),))
        self.stats = ConsumeStats()
        self._db = None  # cronbox's connection while messages flow
        self.loop = BrokerLoop(runtime, self.link, command="amqp consume", detail=queue, counts=self.stats.counts,
                               run_inbound=self._run_inbound, connected=self._connected, sessions=self._sessions,
                               release=self._release_db, stop_names={"max-jobs": "max-messages"},
                               return_read_ahead=not ordered)

    # -- the run (outbox.amqp.broker_loop) ----------------------------------------
    def run(self, budget: Budget) -> RunResult:
        return self.loop.run(budget)

    def _connected(self) -> str:
        self.stats.connects += 1
        return f"queue {_shown(self.queue)} (prefetch {self.link.prefetch}{', ordered' if self.ordered else ''})"

    def _run_inbound(self, budget: Budget) -> None:
        self._handle(self.link.inbound.popleft(), budget)

    # -- the database connection ---------------------------------------------------
    def _connection(self):
        if self._db is None:
            self._db = self.runtime.engine.connect()
        return self._db

    def _sessions(self):
        return session_factory(self._db) if self._db is not None else self.runtime.sessions

    def _release_db(self) -> None:
        connection, self._db = self._db, None
        if connection is not None:
            try:
                connection.close()
            except Exception:
                pass

    # -- one message ---------------------------------------------------------------
    def _handle(self, message, budget: Budget) -> None:
        started = clock.monotonic()
        tag = message.delivery_tag
        try:
            if isinstance(message, Unreadable):
                self._park_unreadable(message, started)
                return
            if not self.ordered:
                if (message.delivery_info or {}).get("redelivered"):
                    self._requeue_redelivered(message, started)
                    return
                if queues.attempts_of(headers_of(message), queues.REDELIVERIES, below=self.max_redeliveries):
                    # a suspect: run it as the oldest unacked message, so that if it kills the
                    # process it is the first the broker redelivers (see _requeue_redelivered)
                    self.link.flush_acks()
            try:
                incoming = parse(message, self.runtime.consumers, self.runtime)
            except BadMessage as bad:
                self._park(message, f"bad message: {bad.reason}", queues.attempts_of(headers_of(message)), None)
                self.link.ack(tag)
                self.stats.bad += 1
                self._log(message, None, "bad", started, error=bad.reason)
                return
            if self.ordered:
                counted = bool((message.delivery_info or {}).get("redelivered"))
                if counted and self._park_if_poison(message, incoming, started):
                    return
                if self._handle_in_place(message, incoming, budget, started) and counted:
                    in_transaction(self._db_sessions(), lambda s: redeliveries.forget(s, self.queue, incoming.message_id))
            else:
                self._handle_once(message, incoming, started)
        except CONNECTION_ERRORS as exc:
            if not is_connection_lost(exc):
                self._give_back_quietly(tag)
                raise
            self._give_back_quietly(tag)
            raise DatabaseLost(describe(getattr(exc, "orig", None) or exc, 200)) from exc
        finally:
            budget.record(clock.monotonic() - started)

    def _park_unreadable(self, message: Unreadable, started: float) -> None:
        """A delivery py-amqp could not decode (outbox.amqp.unreadable): parked in Q.dead as it came,
        its body and its property bytes (in a header) kept for the operator, then acked."""
        reason = clean_text(f"bad message: its properties cannot be read ({message.error})", queues.REASON_MAX)
        self.link.publish(queues.dead_queue(self.queue), message.body, {"delivery_mode": 2, "application_headers": {
            queues.REASON: reason, queues.PARKED_AT: queues.now_text(), queues.ATTEMPTS: 0,
            RAW_PROPERTIES: message.raw_properties}})
        self.link.ack(message.delivery_tag)
        self.stats.bad += 1
        log.warning("amqp queue=%s message=- type=- outcome=bad ms=%.1f error=%r", _shown(self.queue),
                    (clock.monotonic() - started) * 1000, log_text(reason))

    def _requeue_redelivered(self, message, started: float) -> None:
        """The broker gave this message back unacked (a consumer process died, or its connection did,
        with the message in hand): before any consumer runs it again, republish it to the back of Q
        with x-cronbox-redeliveries raised, or park it once that reaches max_redeliveries (a poison
        message: it would kill every consumer it reaches, forever). Then ack the original.

        Only the first redelivered message on a connection is counted: the broker gives unacked
        messages back at their places, and a suspect (a copy with the header) runs as the oldest
        unacked one, so when it killed the process it comes first. The others (read ahead, or
        handled with their batched ack lost) get the header at 1, a suspect, without counting: a
        message is parked only for deaths while it was in hand, not for its neighbours'."""
        headers = headers_of(message)
        before = queues.attempts_of(headers, queues.REDELIVERIES, below=self.max_redeliveries)
        first, self.link.redelivery_seen = not self.link.redelivery_seen, True
        times = before + 1 if first else max(before, 1)
        if first and times >= self.max_redeliveries:
            reason = f"killed the consumer {times} times (redelivered unacked; the limit is {self.max_redeliveries})"
            self._park(message, reason, queues.attempts_of(headers), None, redeliveries=times)
            self.link.ack(message.delivery_tag)
            self.stats.parked += 1
            self._log(message, None, "parked", started, error=reason)
            return
        self._republish(message, self.queue, queues.stamped(headers, **{
            queues.ATTEMPTS: queues.attempts_of(headers) or None, queues.REASON: headers.get(queues.REASON),
            queues.REDELIVERIES: times}))
        self.link.ack(message.delivery_tag)
        self._log(message, None, "redelivered", started, note=f"redeliveries={times}; requeued at the back")

    def _park_if_poison(self, message, incoming: Incoming, started: float) -> bool:
        """--ordered: the message came back unacked, and cannot be moved to the back to carry its count
        (later messages of its key would overtake it). Count it in the database (outbox.events.redeliveries)
        before any consumer runs it again; park it once the count reaches max_redeliveries. With
        prefetch 1 the message in hand is the only one unacked, so the one redelivered is the one
        the process died with (or lost its connection with): no neighbour is counted."""
        times = in_transaction(self._db_sessions(),
                               lambda s: redeliveries.count(s, self.queue, incoming.message_id, clock.utcnow()))
        if times < self.max_redeliveries:
            log.warning("amqp consume: message=%s redelivered unacked (%d of %d before it is parked); handled in place "
                        "trace=%s", _shown(incoming.message_id), times, self.max_redeliveries, incoming.trace_id)
            return False
        reason = f"killed the consumer {times} times (redelivered unacked; the limit is {self.max_redeliveries})"
        self._park(message, reason, incoming.attempts, None, redeliveries=times)
        self.link.ack(message.delivery_tag)
        self.link.flush_acks()  # before the count goes: a crash in between parks a copy, never runs it
        in_transaction(self._db_sessions(), lambda s: redeliveries.forget(s, self.queue, incoming.message_id))
        self.stats.parked += 1
        self._log(message, incoming, "parked", started, error=reason)
        return True

    def _db_sessions(self):
        """Sessions on the run's database connection (opened if the queue was idle)."""
        self._connection()
        return self._sessions()

    def _give_back_quietly(self, tag: int) -> None:
        try:
            self.link.give_back(tag)
        except Exception:
            self.link.close(graceful=False)  # it comes back anyway once the channel is gone

    def _attempt_once(self, message, incoming: Incoming, attempt: int, started: float):
        """Run the consumers: None if that finished the message (acked: done, or parked), else what
        to wait: (seconds, whether an attempt was used, the failures, per-consumer results)."""
        failures, results = self._run_consumers(incoming, attempt)
        if not failures:
            self._finish(message, incoming, results, started)
            return None
        if self._park_if_over(message, incoming, failures, attempt, results, started):
            return None
        return (*self._next_wait(failures, attempt), failures, results)

    def _handle_once(self, message, incoming: Incoming, started: float) -> None:
        attempt = incoming.attempts + 1
        wait = self._attempt_once(message, incoming, attempt, started)
        if wait is None:
            return
        delay, used, failures, results = wait
        target = self.link.declare(queues.retry_queue(self.queue, delay), queues.retry_arguments(self.queue, delay))
        attempts = attempt if used else incoming.attempts
        self._republish(message, target, queues.stamped(headers_of(message), **{
            queues.ATTEMPTS: attempts, queues.REASON: _reason(failures)}))
        self.link.ack(message.delivery_tag)
        self._count_wait(used)
        self._log(message, incoming, "retry" if used else "retry-later", started, attempt=attempt, results=results,
                  error=_reason(failures), note=f"next in {delay:g}s via {target}")

    def _handle_in_place(self, message, incoming: Incoming, budget: Budget, started: float) -> bool:
        """--ordered: wait the delay holding the message, then run the consumers that did not commit.
        True when the message is finished (acked: done or parked), False when it was given back."""
        attempt = incoming.attempts + 1
        while True:
            wait = self._attempt_once(message, incoming, attempt, started)
            if wait is None:
                return True
            delay, used, failures, results = wait
            self._log(message, incoming, "retry" if used else "retry-later", started, attempt=attempt,
                      results=results, error=_reason(failures), note=f"next in {delay:g}s, in place")
            self._count_wait(used)
            self._release_db()
            if not self._hold(delay, budget):
                self.link.give_back(message.delivery_tag)
                log.info("amqp consume: message=%s given back to %s while waiting (stopping)",
                         _shown(incoming.message_id), _shown(self.queue))
                return False
            if used:
                attempt += 1

    def _count_wait(self, attempt_used: bool) -> None:
        if attempt_used:
            self.stats.retried += 1
        else:
            self.stats.deferred += 1

    def _hold(self, seconds: float, budget: Budget) -> bool:
        """Wait `seconds` with the message unacked, servicing the connection; False if the run ends first."""
        end = clock.monotonic() + seconds
        while (left := end - clock.monotonic()) > 0:
            if budget.signalled or budget.remaining() <= 0.05:
                return False
            self.loop.beat()
            self.link.poll(min(left, POLL, max(budget.remaining(), 0.05)))
        return True

    def _run_consumers(self, incoming: Incoming, attempt: int) -> tuple[list, dict]:
        failures, results = [], {}
        for consumer in incoming.consumers:
            outcome = self._run_consumer(consumer, incoming, attempt)
            if outcome is None:
                results[consumer.name] = "duplicate"
            elif outcome.ok:
                results[consumer.name] = "done"
            else:
                results[consumer.name] = outcome.kind
                failures.append((consumer, outcome))
        return failures, results

    def _run_consumer(self, consumer, incoming: Incoming, attempt: int) -> Outcome | None:
        """The consumer's outcome in its own transaction; None if it had already handled the message."""
        ctx = Context(attempt=attempt, trace_id=incoming.trace_id,
                      idempotency_key=_idempotency_key(consumer.name, incoming.message_id),
                      connection=self._connection(), settings=self.runtime.settings, savepoint=False)
        try:
            connection = self._attempt(ctx)
            transaction = ctx.transaction
            first = transaction.outer  # the transaction the inbox row is written in
            if not inbox.take_first(connection, consumer.name, incoming.message_id, incoming.type,
                                    incoming.trace_id, clock.utcnow()):
                return None
            outcome = call_handler(consumer.fn, (incoming.event, ctx), timeout=consumer.timeout,
                                   scope=self.runtime.scope_for(ctx))
            if not outcome.ok:
                ctx.discard_session(invalidate=outcome.kind == TIMEOUT)
                return outcome

            def inbox_row_kept(transaction) -> Outcome | None:
                if first.is_active or first in transaction.committed or self._take_again(ctx, incoming, consumer):
                    return None
                return Outcome(DUPLICATE, outcome.seconds)  # the handler's rollback() took the row, and a copy committed

            outcome = settle(ctx, outcome, inbox_row_kept, step="inbox")  # the handler's writes and the inbox row
            if outcome.kind == DUPLICATE:
                return None
            if outcome.raised is not None and is_connection_lost(outcome.raised):
                raise outcome.raised
            return outcome
        finally:
            ctx.discard_session()

    @staticmethod
    def _attempt(ctx: Context):
        """The attempt's transaction opened on cronbox's connection, before the handler's session
        joins it (without a savepoint: Context(savepoint=False)), so that the inbox row is its
        first statement: a copy already handled is skipped before its handler runs."""
        return ctx.begin().connection

    @staticmethod
    def _take_again(ctx: Context, incoming: Incoming, consumer) -> bool:
        """The handler's rollback() (or close()) rolled back the transaction that held the inbox
        row: write it again in the transaction the handler's later writes are in (its own rollback
        costs no SAVEPOINT per message this way). False if a concurrent copy committed it meanwhile:
        this attempt is then rolled back whole, and its writes happen once, the copy's. (In that
        window the copy's handler may run alongside this one: outside effects of a handler that
        calls rollback() can happen twice for two copies handled at once, as for any crash.)"""
        ctx.transaction.begin()
        if inbox.take_first(ctx.transaction.connection, consumer.name, incoming.message_id, incoming.type,
                            incoming.trace_id, clock.utcnow()):
            return True
        ctx.discard_session()
        return False

    def _finish(self, message, incoming: Incoming, results: dict, started: float) -> None:
        crash_point("after-inbox-commit")
        self.link.ack(message.delivery_tag)  # batched: consumer_link.Link.ack
        if all(r == "duplicate" for r in results.values()):
            self.stats.duplicates += 1
            self._log(message, incoming, "duplicate", started, results=results)
        else:
            self.stats.done += 1
            self._log(message, incoming, "done", started, attempt=incoming.attempts + 1, results=results)

    def _park_if_over(self, message, incoming: Incoming, failures: list, attempt: int, results: dict,
                      started: float) -> bool:
        """PermanentFailure, or a consumer out of attempts: park the message in Q.dead, ack it."""
        over = [(c, o) for c, o in failures
                if o.kind == PERMANENT or (o.kind != RETRY_LATER and last_attempt(attempt, c))]
        if not over:
            return False
        used = any(o.kind != RETRY_LATER for _c, o in failures)
        self._park(message, _reason(over), attempt if used else incoming.attempts, ",".join(c.name for c, _o in over))
        self.link.ack(message.delivery_tag)
        self.stats.parked += 1
        self._log(message, incoming, "parked", started, attempt=attempt, results=results, error=_reason(over))
        return True

    @staticmethod
    def _next_wait(failures: list, attempt: int) -> tuple[float, bool]:
        """(seconds, whether an attempt was used): the shortest wait any failing consumer asks for."""
        used = any(o.kind != RETRY_LATER for _c, o in failures)
        waits = [queues.retry_later_delay(c.backoff, c.max_attempts, o.retry_in or 0) if o.kind == RETRY_LATER
                 else queues.retry_delay(c.backoff, attempt) for c, o in failures]
        return min(waits), used

    def _park(self, message, reason: str, attempts: int, failed: str | None, *, redeliveries: int | None = None) -> None:
        self._republish(message, queues.dead_queue(self.queue), queues.stamped(headers_of(message), **{
            queues.ATTEMPTS: attempts, queues.REASON: clean_text(reason, queues.REASON_MAX),
            queues.PARKED_AT: queues.now_text(), queues.FAILED: failed, queues.REDELIVERIES: redeliveries}))

    def _republish(self, message, queue: str, headers: dict) -> None:
        properties = {**(message.properties or {}), "application_headers": headers, "delivery_mode": 2}
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8", "surrogatepass")
        self.link.publish(queue, body, properties)

    def _log(self, message, incoming: Incoming | None, outcome: str, started: float, *, attempt: int | None = None,
             results: dict | None = None, error: str | None = None, note: str | None = None) -> None:
        """One line per message: ids, outcome, trace id, never the payload (the error text masked)."""
        props = message.properties or {}
        mid = incoming.message_id if incoming else clean_text(str(props.get("message_id") or "-"), 80)
        trace = incoming.trace_id if incoming else trace_id_of(props)
        kind = incoming.type if incoming else clean_text(str(props.get("type") or "-"), 80)
        line = (f"amqp queue={self.queue} message={mid} type={kind} outcome={outcome}"
                + (f" attempt={attempt}" if attempt is not None else "")
                + (" consumers=" + ",".join(f"{n}:{r}" for n, r in results.items()) if results else "")
                + f" trace={trace} ms={(clock.monotonic() - started) * 1000:.1f}")
        if error:
            line += f" error={log_text(error)!r}"
        if note:
            line += f" ({note})"
        # every field came from the message or the command line: one line, nothing a terminal acts on
        (log.info if outcome in ("done", "duplicate") else log.warning)(clean_text(line, len(line) * 6 + 1))


def _shown(value, limit: int = 300) -> str:
    """A message's or the command line's value for a log line (clean_text: no line breaks, controls
    or bidi marks)."""
    return clean_text(str(value), limit)


def _idempotency_key(consumer: str, message_id: str) -> str:
    key = f"amqp-{message_id}-{consumer}"
    return key if len(key) <= NAME_MAX else "amqp-" + hashlib.sha256(f"{consumer}\0{message_id}".encode()).hexdigest()


def _reason(failures: list) -> str:
    return "; ".join(f"{c.name}: {o.error or o.kind}" for c, o in failures)[:queues.REASON_MAX]
