"""A consumer's connection and channel, for `amqp consume` (outbox.events.consume) and `amqp work`
(outbox.queue.broker_worker): consuming its queues with a prefetch, acking in batches, and
republishing with publisher confirms; the queues declared as asked. Which queues a consumer keeps
beside its own, and what their names mean, is its family's (an event consumer's Q.dead and
Q.retry.<ms>ms: outbox.events.queues); the link only declares them."""
from __future__ import annotations

import select
import socket
from collections import deque

import amqp

from cronbox.outbox.amqp.broker import (
    CONNECT_TIMEOUT,
    Batch,
    BrokerAddress,
    close_connection,
    ensure_queue,
    open_connection,
)
from cronbox.outbox.amqp.unreadable import Unreadable, UnreadableFrames
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.text import describe

CONFIRM_TIMEOUT = 30.0  # a republish (retry, park) the broker has not confirmed by then: reconnect
ACK_WAIT = 0.1  # seconds a handled message's ack may wait to go out with later ones (basic.ack multiple)
NAME = "cronbox consumer"


class BrokerLost(Exception):
    """A republish was not confirmed: the connection is dropped and opened again."""


class SetupError(CronboxError):
    """The queue cannot be used as asked (missing, declared with other arguments, no permission)."""


class Link:
    """The consumer's connection and channel: consuming Q with a prefetch, acking, and republishing
    (to another queue: an event consumer's retry queue or Q.dead) with publisher confirms. Deliveries
    are queued in `inbound` by the channel's callback (or, for one py-amqp cannot decode, by the
    connection's frame handler as an outbox.amqp.unreadable.Unreadable) and handled by the loop, never
    inside the callback: a confirm wait reads frames too, and must not start handling the next message
    from within the current one. `beside`: durable queues declared with Q at each open (an event
    consumer's Q.dead)."""

    def __init__(self, address: BrokerAddress, queue: str, *, prefetch: int, ordered: bool,
                 binds: list[tuple[str, str]], heartbeat_seconds: int, jobs: tuple[str, ...] = (), name: str = NAME,
                 beside: tuple[str, ...] = ()):
        self.address, self.queue, self.prefetch, self.ordered, self.binds = address, queue, prefetch, ordered, binds
        self.beside = beside
        # Forwarded job queues (outbox.queue.broker_worker; `queue` is the first of them): each declared
        # durable, as their publisher declares them, and consumed on the one channel; no Q.dead (a
        # failed job is its row's state, not a parked message).
        self.jobs, self.name = jobs, name
        self.heartbeat_seconds = heartbeat_seconds
        self.connection: amqp.Connection | None = None
        self.channel = None
        self.inbound: deque = deque()
        self.consuming: dict[str, str] = {}  # consumer tag -> its queue, on this connection
        self._tag = 0
        self._batch: Batch | None = None
        self._declared: set[str] = set()
        self._ack_tag = 0  # the highest handled delivery not acked yet (0: none)
        self._ack_count = 0
        self._ack_since = 0.0
        self.ack_every = 1 if ordered else max(1, prefetch // 2)
        self.redelivery_seen = False  # on this connection (consume.QueueConsumer._requeue_redelivered)

    @property
    def is_open(self) -> bool:
        return self.connection is not None

    def open(self) -> None:
        connection = open_connection(self.address, name=self.name, timeout=CONNECT_TIMEOUT,
                                     heartbeat=self.heartbeat_seconds,
                                     frame_handler=UnreadableFrames.factory(self.inbound.append))
        try:
            for queue in self.jobs:
                try:
                    ensure_queue(connection, queue)
                except amqp.exceptions.ChannelError as exc:
                    raise SetupError(f"cannot use job queue {queue!r}: {describe(exc, 300)}") from None
            channel = connection.channel()
            self._declare(channel)
            channel.confirm_select()
            channel.events["basic_ack"].add(lambda tag, multiple: self._batch and self._batch.on_ack(tag, multiple))
            channel.events["basic_nack"].add(
                lambda tag, multiple: self._batch and self._batch.on_ack(tag, multiple, nacked=True))
            channel.events["basic_return"].add(lambda *args: self._batch and self._batch.on_return(*args))
            # Several job queues on one channel: --prefetch counts for the channel, not for each queue.
            channel.basic_qos(0, self.prefetch, len(self.jobs) > 1)
            self.inbound.clear()  # tags of a closed channel mean nothing on this one
            consuming = {channel.basic_consume(queue, callback=self.inbound.append, no_ack=False): queue
                         for queue in self.jobs or (self.queue,)}
        except BaseException:
            close_connection(connection, graceful=False)
            raise
        self.consuming = consuming
        self.connection, self.channel, self._tag, self._declared = connection, channel, 0, set()
        self._ack_tag = self._ack_count = 0
        self.redelivery_seen = False

    def _declare(self, channel) -> None:
        try:
            if self.jobs:
                return  # declared by open() (broker.ensure_queue), on channels of their own
            if self.binds or self.ordered:
                arguments = {"x-single-active-consumer": True} if self.ordered else None
                channel.queue_declare(self.queue, durable=True, auto_delete=False, arguments=arguments)
                for exchange, pattern in self.binds:
                    channel.queue_bind(self.queue, exchange, pattern)
            else:
                channel.queue_declare(self.queue, passive=True)
            for name in self.beside:
                channel.queue_declare(name, durable=True, auto_delete=False)
        except amqp.exceptions.NotFound as exc:
            what = "an exchange to bind to" if self.binds else f"queue {self.queue!r}"
            raise SetupError(f"{what} does not exist ({describe(exc, 200)}); declare it, or pass "
                             "--bind EXCHANGE[:PATTERN] to declare the queue and bind it") from None
        except amqp.exceptions.PreconditionFailed as exc:
            raise SetupError(f"queue {self.queue!r} exists with other arguments ({describe(exc, 200)}); "
                             "--ordered needs it declared with x-single-active-consumer (delete it first)") from None
        except amqp.exceptions.ChannelError as exc:
            raise SetupError(f"cannot use queue {self.queue!r}: {describe(exc, 300)}") from None

    def declare(self, name: str, arguments: dict) -> str:
        """A durable queue to republish to (an event consumer's retry queue), declared once per
        connection: its name."""
        if name not in self._declared:
            self.channel.queue_declare(name, durable=True, auto_delete=False, arguments=arguments)
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
        """The message `tag` is done (committed, or republished and confirmed): its ack goes out with
        the later ones' in one basic.ack multiple, at the latest after ack_every messages or ACK_WAIT
        seconds, when nothing more is read ahead, or before the channel closes (flush_acks). Handled
        in delivery order, so every tag the multiple ack covers is done. A crash before it only
        makes the broker deliver those messages again, and the inbox skips their consumers."""
        if not self._ack_count:
            self._ack_since = clock.monotonic()
        self._ack_tag = tag
        self._ack_count += 1
        if self._ack_count >= self.ack_every or clock.monotonic() - self._ack_since >= ACK_WAIT:
            self.flush_acks()

    @property
    def acks_pending(self) -> bool:
        return self._ack_count > 0

    def flush_acks(self) -> None:
        if not self._ack_count:
            return
        tag, self._ack_tag, self._ack_count = self._ack_tag, 0, 0
        crash_point("before-broker-ack")
        self.channel.basic_ack(tag, multiple=True)
        crash_point("after-broker-ack")

    def give_back(self, tag: int) -> None:
        """Back to the queue, at its place (basic.reject with requeue); the done ones acked first."""
        self.flush_acks()
        self.channel.basic_reject(tag, True)

    def return_read_ahead(self) -> int:
        """At a clean stop, before the connection closes: give back the messages the broker sent
        ahead (the prefetch) that nothing started, WITHOUT the `redelivered` flag a close or a reject
        would put on them, which the next run would take for a consumer's death (consume's
        _requeue_redelivered counts it, and parks the message once it reaches max_redeliveries).

        The consumers are cancelled first (basic.cancel waits for cancel-ok; what the broker sent
        before it arrives in `inbound` through the callback meanwhile), then each message left is
        republished unchanged (same body and properties, default exchange, to the queue it came
        from, confirmed: `publish`) and its original acked after the confirm. It goes to the back
        of the queue: order within a queue is not promised here (a retry goes to the back too). A
        crash between the republish and the ack leaves two copies; the inbox skips the second's
        consumers. A message py-amqp could not decode (Unreadable) is left unacked: it goes back
        with the close, as it came. The number given back; a broker error propagates (the caller
        then closes as before, and what was not given back comes again flagged redelivered)."""
        self.flush_acks()
        for consumer_tag in list(self.consuming):
            self.channel.basic_cancel(consumer_tag)
        given = 0
        while self.inbound:
            message = self.inbound[0]
            if not isinstance(message, Unreadable):
                queue = self.consuming.get((message.delivery_info or {}).get("consumer_tag"), self.queue)
                properties = dict(message.properties or {})
                body = message.body
                if not isinstance(body, bytes):  # py-amqp decoded it by its content_encoding: encoded back
                    body = str(body).encode(properties.get("content_encoding") or "utf-8", "surrogatepass")
                self.publish(queue, body, properties)
                crash_point("before-read-ahead-ack")
                self.channel.basic_ack(message.delivery_tag)  # this one only: an Unreadable before it stays unacked
                given += 1
            self.inbound.popleft()
        return given

    def readable(self) -> bool:
        """Something already came from the broker and waits to be read (no waiting)."""
        sock = self.connection.sock
        if hasattr(sock, "pending") and sock.pending():  # TLS: decrypted, unread
            return True
        # Bytes py-amqp already read into its own buffer are not seen here (only a private name of
        # its transport holds them): the acks then go out a little early, which costs nothing else.
        return bool(select.select([sock], [], [], 0)[0])

    def poll(self, timeout: float) -> bool:
        """Read what the broker sends until one whole method (a delivery: three frames) has come, for
        at most about `timeout` seconds; False if nothing came. py-amqp's blocking_read() reads one
        frame and says whether a method is complete; not drain_events(), which loops on it with the
        timeout applying to each frame: the broker's heartbeats arriving more often than that would
        keep it reading, and ours would never be sent."""
        connection = self.connection
        connection.heartbeat_tick()  # sends ours when due; raises if the broker's stopped coming
        if connection.heartbeat:
            timeout = min(timeout, max(connection.heartbeat / 4, 0.05))
        deadline = clock.monotonic() + timeout
        try:
            while not connection.blocking_read(max(deadline - clock.monotonic(), 0.001)):
                if clock.monotonic() >= deadline:
                    break
        except socket.timeout:
            return False
        return True

    def close(self, *, graceful: bool = True) -> None:
        """Graceful: cancel and close (unacked prefetched messages go back to the queue at once)."""
        if graceful and self.connection is not None:
            try:
                self.flush_acks()
            except Exception:
                graceful = False  # not acked: those messages come again, and the inbox skips them
        self._ack_tag = self._ack_count = 0
        self.redelivery_seen = False
        connection, self.connection, self.channel = self.connection, None, None
        self.inbound.clear()
        self.consuming = {}
        if connection is not None:
            close_connection(connection, graceful=graceful)


BROKER_ERRORS = (amqp.exceptions.AMQPError, OSError, BrokerLost)
