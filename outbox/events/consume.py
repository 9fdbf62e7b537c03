"""Running the registered consumers off a RabbitMQ queue: `python -m cron amqp consume --queue Q`.

Per message (the relay's forward targets publish them: outbox.events.forward.message_properties):
1. check it: a body over MAX_BODY bytes, no or an oversized message_id, no type, a type no consumer
   here is registered for, or a body that is not JSON is a bad message: parked in Q.dead with the
   reason, acked, and the queue goes on;
2. for each consumer registered for its type (forward targets excluded), in its own transaction on
   cronbox's connection: `inbox.take_first()` writes the (consumer, message_id) row as its first
   statement, outside the handler's savepoint (a copy already handled finds it: that consumer is
   skipped), the handler runs through `call_handler` (timeout,
   outcome, safe error text) inside the host app's scope (`runtime.scope_for`), then one COMMIT
   holds the handler's writes and the inbox row, or a rollback neither;
3. only then the broker ack. A failure is republished first (publisher confirm) and acked after:
   - retried: to `Q.retry.<ms>ms` with the attempt header raised; its TTL dead-letters it back to
     Q (outbox.events.queues). A retry re-runs only the consumers that did not commit: the others
     find their inbox row;
   - `RetryLater(seconds)`: the same, without an attempt (queues.retry_later_delay says which queue);
   - parked in Q.dead when a consumer raised PermanentFailure or used its max_attempts.
   With several failing consumers the message waits the shortest of their delays.
   `ordered`: the queue has a single active consumer, prefetch 1, and a failure waits its delay
   holding the message (heartbeats serviced), so nothing later overtakes it.

The broker connection (one, named "cronbox consumer", AMQP heartbeats serviced between messages and
while idle) is dropped on any error and opened again with backoff until the run's end; unacked
messages go back to the queue and come again, where the inbox keeps their effects to once. Between
messages SIGTERM/SIGINT stop the loop (outbox.engine.run_loop.StopSignals): the message being
handled is finished, committed and acked first. The database connection is held while messages
flow and given back when the queue is idle (MySQL kills connections idle past wait_timeout).
"""
from __future__ import annotations

import hashlib
import json
import logging
import socket
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone

import amqp
from sqlalchemy.exc import DBAPIError

from outbox.core import clock
from outbox.core.db import is_connection_lost, session_factory
from outbox.core.errors import CronboxError
from outbox.core.faults import crash_point
from outbox.core.logs import log_text
from outbox.engine import heartbeat
from outbox.engine.budget import Budget
from outbox.engine.context import Context, Event
from outbox.engine.handler_call import ERROR, PERMANENT, RETRY_LATER, TIMEOUT, Outcome, call_handler, clean_text, describe
from outbox.engine.run_loop import RunResult, StopSignals
from outbox.events import inbox, queues
from outbox.events.broker import Batch, BrokerAddress, open_connection
from outbox.events.forward import is_forward

log = logging.getLogger("cronbox")

MAX_BODY = 1024 * 1024  # bytes; a larger message is parked as bad (events are small JSON documents)
HEARTBEAT = 60  # seconds, the AMQP heartbeat asked of the broker (keep handler timeouts below it)
CONNECT_TIMEOUT = 5.0
CONFIRM_TIMEOUT = 30.0  # a republish (retry, park) the broker has not confirmed by then: reconnect
POLL = 1.0
RECONNECT_FIRST, RECONNECT_MAX = 1.0, 30.0
DB_PAUSE = 3.0
NAME = "cronbox consumer"


class SetupError(CronboxError):
    """The queue cannot be used as asked (missing, declared with other arguments, no permission)."""


class BrokerLost(Exception):
    """A republish was not confirmed: the connection is dropped and opened again."""


class DatabaseLost(Exception):
    pass


class BadMessage(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


BROKER_ERRORS = (amqp.exceptions.AMQPError, OSError, BrokerLost)


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


@dataclass(frozen=True)
class Incoming:
    message_id: str
    type: str
    trace_id: str
    event: Event
    attempts: int  # failed attempts before this delivery (the x-cronbox-attempts header)
    consumers: list


class Link:
    """The consumer's connection and channel: consuming Q with a prefetch, acking, and republishing
    (to a retry queue or Q.dead) with publisher confirms. Deliveries are queued in `inbound` by the
    channel's callback and handled by the loop, never inside the callback: a confirm wait reads
    frames too, and must not start handling the next message from within the current one."""

    def __init__(self, address: BrokerAddress, queue: str, *, prefetch: int, ordered: bool,
                 binds: list[tuple[str, str]], heartbeat_seconds: int):
        self.address, self.queue, self.prefetch, self.ordered, self.binds = address, queue, prefetch, ordered, binds
        self.heartbeat_seconds = heartbeat_seconds
        self.connection: amqp.Connection | None = None
        self.channel = None
        self.inbound: deque = deque()
        self._tag = 0
        self._batch: Batch | None = None
        self._declared: set[str] = set()

    @property
    def is_open(self) -> bool:
        return self.connection is not None

    def open(self) -> None:
        connection = open_connection(self.address, name=NAME, timeout=CONNECT_TIMEOUT,
                                     heartbeat=self.heartbeat_seconds)
        try:
            channel = connection.channel()
            self._declare(channel)
            channel.confirm_select()
            channel.events["basic_ack"].add(lambda tag, multiple: self._batch and self._batch.on_ack(tag, multiple))
            channel.events["basic_nack"].add(
                lambda tag, multiple: self._batch and self._batch.on_ack(tag, multiple, nacked=True))
            channel.events["basic_return"].add(lambda *args: self._batch and self._batch.on_return(*args))
            channel.basic_qos(0, self.prefetch, False)
            self.inbound.clear()  # tags of a closed channel mean nothing on this one
            channel.basic_consume(self.queue, callback=self.inbound.append, no_ack=False)
        except BaseException:
            _drop(connection)
            raise
        self.connection, self.channel, self._tag, self._declared = connection, channel, 0, set()

    def _declare(self, channel) -> None:
        try:
            if self.binds or self.ordered:
                arguments = {"x-single-active-consumer": True} if self.ordered else None
                channel.queue_declare(self.queue, durable=True, auto_delete=False, arguments=arguments)
                for exchange, pattern in self.binds:
                    channel.queue_bind(self.queue, exchange, pattern)
            else:
                channel.queue_declare(self.queue, passive=True)
            channel.queue_declare(queues.dead_queue(self.queue), durable=True, auto_delete=False)
        except amqp.exceptions.NotFound as exc:
            what = "an exchange to bind to" if self.binds else f"queue {self.queue!r}"
            raise SetupError(f"{what} does not exist ({describe(exc, 200)}); declare it, or pass "
                             "--bind EXCHANGE[:PATTERN] to declare the queue and bind it") from None
        except amqp.exceptions.PreconditionFailed as exc:
            raise SetupError(f"queue {self.queue!r} exists with other arguments ({describe(exc, 200)}); "
                             "--ordered needs it declared with x-single-active-consumer (delete it first)") from None
        except amqp.exceptions.ChannelError as exc:
            raise SetupError(f"cannot use queue {self.queue!r}: {describe(exc, 300)}") from None

    def ensure_retry_queue(self, seconds: float) -> str:
        name = queues.retry_queue(self.queue, seconds)
        if name not in self._declared:
            self.channel.queue_declare(name, durable=True, auto_delete=False,
                                       arguments=queues.retry_arguments(self.queue, seconds))
            self._declared.add(name)
        return name

    def publish(self, routing_key: str, body: bytes, properties: dict) -> None:
        """Publish to a queue (default exchange, mandatory) and wait for the broker's confirm."""
        batch = self._batch = Batch(1)
        try:
            self._tag += 1
            batch.by_tag[self._tag] = 0
            self.channel.basic_publish(amqp.Message(body, **properties), exchange="", routing_key=routing_key,
                                       mandatory=True)
            end = clock.monotonic() + CONFIRM_TIMEOUT
            while batch.by_tag:
                left = end - clock.monotonic()
                if left <= 0:
                    raise BrokerLost(f"no confirm within {CONFIRM_TIMEOUT:g}s for a message to {routing_key}")
                try:
                    self.connection.drain_events(timeout=left)
                except socket.timeout:
                    continue
        finally:
            self._batch = None
        error = batch.finish([properties.get("message_id")], "unconfirmed")[0]
        if error is not None:
            raise BrokerLost(f"republish to {routing_key} failed: {error}")

    def ack(self, tag: int) -> None:
        self.channel.basic_ack(tag)

    def give_back(self, tag: int) -> None:
        """Back to the queue, at its place (basic.reject with requeue)."""
        self.channel.basic_reject(tag, True)

    def poll(self, timeout: float) -> bool:
        """Read what the broker sends until one whole method (a delivery: three frames) has come, for
        at most about `timeout` seconds; False if nothing came. Not drain_events(), whose timeout is
        per frame: the broker's heartbeats arriving more often than that would keep it reading, and
        ours would never be sent. The socket's timeout is set once per call, not once per frame
        (two fcntl calls each time)."""
        connection = self.connection
        connection.heartbeat_tick()  # sends ours when due; raises if the broker's stopped coming
        if connection.heartbeat:
            timeout = min(timeout, max(connection.heartbeat / 4, 0.05))
        deadline = clock.monotonic() + timeout
        transport = connection.transport
        try:
            with transport.having_timeout(timeout):
                while not connection.on_inbound_frame(transport.read_frame()):
                    if clock.monotonic() >= deadline:
                        break
        except socket.timeout:
            return False
        return True

    def close(self, *, graceful: bool = True) -> None:
        """Graceful: cancel and close (unacked prefetched messages go back to the queue at once)."""
        connection, self.connection, self.channel = self.connection, None, None
        self.inbound.clear()
        if connection is None:
            return
        if graceful:
            try:
                connection.close()
                return
            except Exception:
                pass
        _drop(connection)


def _drop(connection) -> None:
    try:
        connection.collect()
    except Exception:
        pass


class QueueConsumer:
    def __init__(self, runtime, address: BrokerAddress, queue: str, *, prefetch: int = 10, ordered: bool = False,
                 binds: list[tuple[str, str]] | None = None, heartbeat_seconds: int = HEARTBEAT):
        self.runtime = runtime
        self.queue = queue
        self.ordered = ordered
        self.link = Link(address, queue, prefetch=1 if ordered else prefetch, ordered=ordered, binds=binds or [],
                         heartbeat_seconds=heartbeat_seconds)
        self.stats = ConsumeStats()
        self._db = None  # cronbox's connection while messages flow
        self._heartbeat_id: int | None = None
        self._last_beat = 0.0

    # -- the run -------------------------------------------------------------------
    def run(self, budget: Budget) -> RunResult:
        with StopSignals(budget):
            self._heartbeat_id = heartbeat.start(self.runtime.sessions, "amqp consume", detail=self.queue, beats=True)
            self._last_beat = clock.monotonic()
            try:
                result = self._run(budget)
            except BaseException as exc:
                self.link.close(graceful=False)
                self._release_db()
                try:
                    heartbeat.finish(self.runtime.sessions, self._heartbeat_id, outcome="error", error=describe(exc),
                                     **self.stats.counts())
                except Exception:
                    pass  # the database may be what failed: the row stays "running", as for a killed run
                raise
            self.link.close()
            self._release_db()
            heartbeat.finish(self.runtime.sessions, self._heartbeat_id, outcome=result.stop_reason, error=result.error,
                             **self.stats.counts())
            return result

    def _run(self, budget: Budget) -> RunResult:
        pause = RECONNECT_FIRST
        last_message = clock.monotonic()
        while True:
            reason = budget.stop_reason()
            if reason:
                return RunResult("max-messages" if reason == "max-jobs" else reason)
            self._beat()
            if not self.link.is_open:
                try:
                    self.link.open()
                except SetupError:
                    raise
                except BROKER_ERRORS as exc:
                    why = f"broker unreachable ({self.link.address!r}): {describe(exc, 300)}"
                    log.warning("amqp consume: %s; trying again in %.0fs", why, pause)
                    if not self._pause(budget, pause):
                        return RunResult("broker-unreachable", 1, why)
                    pause = min(pause * 2, RECONNECT_MAX)
                    continue
                pause = RECONNECT_FIRST
                self.stats.connects += 1
                log.info("amqp consume: connected to %r, queue %s (prefetch %d%s)", self.link.address, self.queue,
                         self.link.prefetch, ", ordered" if self.ordered else "")
            try:
                if self.link.inbound:
                    self._handle(self.link.inbound.popleft(), budget)
                    last_message = clock.monotonic()
                    continue
                self.link.poll(min(POLL, max(budget.remaining(), 0.05)))
                if not self.link.inbound and clock.monotonic() - last_message >= POLL:
                    self._release_db()  # idle: hold no database connection while waiting
            except DatabaseLost as exc:
                log.warning("amqp consume: database connection lost (%s); pausing %.0fs", exc, DB_PAUSE)
                self._release_db()
                if not self._pause(budget, DB_PAUSE):
                    return RunResult("lost-connection", 1, "database unreachable until the end of the run")
            except BROKER_ERRORS as exc:
                log.warning("amqp consume: broker connection lost (%s); reconnecting", describe(exc, 300))
                self.link.close(graceful=False)

    def _beat(self) -> None:
        if clock.monotonic() - self._last_beat < heartbeat.BEAT_SECONDS:
            return
        self._last_beat = clock.monotonic()
        try:
            heartbeat.beat(self._sessions(), self._heartbeat_id, **self.stats.counts())
        except DBAPIError as exc:
            if not is_connection_lost(exc):
                raise
            self._release_db()
            log.warning("amqp consume: could not beat (database unreachable)")

    def _pause(self, budget: Budget, seconds: float) -> bool:
        """Wait up to `seconds` (a signal or the run's end cuts it short); False if the run is over."""
        end = clock.monotonic() + min(seconds, budget.remaining())
        while clock.monotonic() < end:
            if budget.signalled:
                return False
            self._beat()
            time.sleep(min(0.1, max(end - clock.monotonic(), 0)))
        return budget.remaining() > 0.05 and not budget.signalled

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
            try:
                incoming = parse(message, self.runtime.consumers)
            except BadMessage as bad:
                self._park(message, f"bad message: {bad.reason}", queues.attempts_of(_headers(message)), None)
                self.link.ack(tag)
                self.stats.bad += 1
                self._log(message, None, "bad", started, error=bad.reason)
                return
            if self.ordered:
                self._handle_in_place(message, incoming, budget, started)
            else:
                self._handle_once(message, incoming, started)
        except DBAPIError as exc:
            if not is_connection_lost(exc):
                self._give_back_quietly(tag)
                raise
            self._give_back_quietly(tag)
            raise DatabaseLost(describe(exc.orig or exc, 200)) from exc
        finally:
            budget.record(clock.monotonic() - started)

    def _give_back_quietly(self, tag: int) -> None:
        try:
            self.link.give_back(tag)
        except Exception:
            self.link.close(graceful=False)  # it comes back anyway once the channel is gone

    def _handle_once(self, message, incoming: Incoming, started: float) -> None:
        attempt = incoming.attempts + 1
        failures, results = self._run_consumers(incoming, attempt)
        if not failures:
            self._finish(message, incoming, results, started)
            return
        if self._park_if_over(message, incoming, failures, attempt, results, started):
            return
        delay, used = self._next_wait(failures, attempt)
        target = self.link.ensure_retry_queue(delay)
        attempts = attempt if used else incoming.attempts
        self._republish(message, target, queues.stamped(_headers(message), **{
            queues.ATTEMPTS: attempts, queues.REASON: _reason(failures)}))
        self.link.ack(message.delivery_tag)
        if used:
            self.stats.retried += 1
        else:
            self.stats.deferred += 1
        self._log(message, incoming, "retry" if used else "retry-later", started, attempt=attempt, results=results,
                  error=_reason(failures), note=f"next in {delay:g}s via {target}")

    def _handle_in_place(self, message, incoming: Incoming, budget: Budget, started: float) -> None:
        """--ordered: wait the delay holding the message, then run the consumers that did not commit."""
        attempt = incoming.attempts + 1
        while True:
            failures, results = self._run_consumers(incoming, attempt)
            if not failures:
                self._finish(message, incoming, results, started)
                return
            if self._park_if_over(message, incoming, failures, attempt, results, started):
                return
            delay, used = self._next_wait(failures, attempt)
            self._log(message, incoming, "retry" if used else "retry-later", started, attempt=attempt,
                      results=results, error=_reason(failures), note=f"next in {delay:g}s, in place")
            if used:
                self.stats.retried += 1
            else:
                self.stats.deferred += 1
            self._release_db()
            if not self._hold(delay, budget):
                self.link.give_back(message.delivery_tag)
                log.info("amqp consume: message=%s given back to %s while waiting (stopping)", incoming.message_id,
                         self.queue)
                return
            if used:
                attempt += 1

    def _hold(self, seconds: float, budget: Budget) -> bool:
        """Wait `seconds` with the message unacked, servicing the connection; False if the run ends first."""
        end = clock.monotonic() + seconds
        while (left := end - clock.monotonic()) > 0:
            if budget.signalled or budget.remaining() <= 0.05:
                return False
            self._beat()
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
                      connection=self._connection(), settings=self.runtime.settings)
        try:
            if not inbox.take_first(self._attempt(ctx), consumer.name, incoming.message_id, incoming.type,
                                    incoming.trace_id, clock.utcnow()):
                return None
            outcome = call_handler(consumer.fn, (incoming.event, ctx), timeout=consumer.timeout,
                                   scope=self.runtime.scope_for(ctx))
            if not outcome.ok:
                ctx.discard_session(invalidate=outcome.kind == TIMEOUT)
                return outcome
            transaction = ctx.transaction
            if transaction.session.failed_with is not None:
                return Outcome(ERROR, outcome.seconds, "the handler left ctx.session failed (call rollback() after "
                                                       f"catching a database error): {transaction.session.failed_with}")
            try:
                crash_point("before-inbox-commit")
                transaction.commit()  # the handler's writes and the inbox row, together
            except DBAPIError as exc:
                if is_connection_lost(exc):
                    raise
                ctx.discard_session(invalidate=True)
                return Outcome(ERROR, outcome.seconds, f"commit failed: {describe(exc, 950)}")
            return outcome
        finally:
            ctx.discard_session()

    @staticmethod
    def _attempt(ctx: Context):
        """The attempt's transaction opened on cronbox's connection, before the handler's session
        joins it with its savepoint: the inbox row, written first, is outside that savepoint, so
        nothing the handler does to its session (rollback()) can undo it."""
        ctx.session  # noqa: B018  (makes the attempt's HandlerTransaction)
        ctx.transaction.begin()
        return ctx.transaction.connection

    def _finish(self, message, incoming: Incoming, results: dict, started: float) -> None:
        crash_point("after-inbox-commit")
        self.link.ack(message.delivery_tag)
        crash_point("after-broker-ack")
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
                if o.kind == PERMANENT or (o.kind != RETRY_LATER and attempt >= c.max_attempts)]
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

    def _park(self, message, reason: str, attempts: int, failed: str | None) -> None:
        self._republish(message, queues.dead_queue(self.queue), queues.stamped(_headers(message), **{
            queues.ATTEMPTS: attempts, queues.REASON: clean_text(reason, queues.REASON_MAX),
            queues.PARKED_AT: queues.now_text(), queues.FAILED: failed}))

    def _republish(self, message, queue: str, headers: dict) -> None:
        properties = {**(message.properties or {}), "application_headers": headers, "delivery_mode": 2}
        body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8", "surrogatepass")
        self.link.publish(queue, body, properties)

    def _log(self, message, incoming: Incoming | None, outcome: str, started: float, *, attempt: int | None = None,
             results: dict | None = None, error: str | None = None, note: str | None = None) -> None:
        """One line per message: ids, outcome, trace id, never the payload (the error text masked)."""
        props = message.properties or {}
        mid = incoming.message_id if incoming else clean_text(str(props.get("message_id") or "-"), 80)
        trace = incoming.trace_id if incoming else _trace_id(props)
        kind = incoming.type if incoming else clean_text(str(props.get("type") or "-"), 80)
        line = (f"amqp queue={self.queue} message={mid} type={kind} outcome={outcome}"
                + (f" attempt={attempt}" if attempt is not None else "")
                + (" consumers=" + ",".join(f"{n}:{r}" for n, r in results.items()) if results else "")
                + f" trace={trace} ms={(clock.monotonic() - started) * 1000:.1f}")
        if error:
            line += f" error={log_text(error)!r}"
        if note:
            line += f" ({note})"
        (log.info if outcome in ("done", "duplicate") else log.warning)(line)


def parse(message, registry) -> Incoming:
    """The message as an event for its consumers; BadMessage with the reason if it cannot be one."""
    props = message.properties or {}
    headers = _headers(message)
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8", "surrogatepass")
    if len(body) > MAX_BODY:
        raise BadMessage(f"body of {len(body)} bytes is over the {MAX_BODY} byte limit")
    message_id = props.get("message_id")
    if not isinstance(message_id, str) or not message_id.strip():
        raise BadMessage("no message_id")
    if len(message_id) > inbox.MAX_MESSAGE_ID:
        raise BadMessage(f"message_id longer than {inbox.MAX_MESSAGE_ID} characters")
    event_type = props.get("type") or headers.get("x-event-type")
    if not isinstance(event_type, str) or not event_type:
        raise BadMessage("no type (neither the type property nor an x-event-type header)")
    consumers = [c for c in registry.for_type(event_type) if not is_forward(c)]
    if not consumers:
        raise BadMessage(f"no consumer registered here for type {clean_text(event_type, 191)!r}")
    try:
        payload = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise BadMessage("body is not JSON (UTF-8)") from None
    key = headers.get("x-event-key")
    event_id = headers.get("x-event-id")
    event = Event(event_id if isinstance(event_id, int) and not isinstance(event_id, bool) else None, event_type,
                  key if isinstance(key, str) else None, payload, _created_at(headers, props))
    return Incoming(message_id, event_type, _trace_id(props), event, queues.attempts_of(headers), consumers)


def _headers(message) -> dict:
    headers = (message.properties or {}).get("application_headers")
    return headers if isinstance(headers, dict) else {}


def _trace_id(props: dict) -> str:
    headers = props.get("application_headers") if isinstance(props.get("application_headers"), dict) else {}
    trace = headers.get("x-trace-id") or props.get("correlation_id")
    return clean_text(trace, 64) if isinstance(trace, str) and trace else "-"


def _created_at(headers: dict, props: dict) -> datetime:
    """Naive UTC, as the relay's events have it: x-created-at, else the timestamp property, else now."""
    text = headers.get("x-created-at")
    if isinstance(text, str):
        try:
            when = datetime.fromisoformat(text)
            return when.astimezone(timezone.utc).replace(tzinfo=None) if when.tzinfo else when
        except ValueError:
            pass
    stamp = props.get("timestamp")
    if isinstance(stamp, datetime):
        return stamp.astimezone(timezone.utc).replace(tzinfo=None) if stamp.tzinfo else stamp
    return clock.utcnow()


def _idempotency_key(consumer: str, message_id: str) -> str:
    key = f"amqp-{message_id}-{consumer}"
    return key if len(key) <= 191 else "amqp-" + hashlib.sha256(f"{consumer}\0{message_id}".encode()).hexdigest()


def _reason(failures: list) -> str:
    return "; ".join(f"{c.name}: {o.error or o.kind}" for c, o in failures)[:queues.REASON_MAX]
