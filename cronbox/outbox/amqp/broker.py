"""The AMQP side of forwarding: one connection per process, batches published with confirms.

Client: py-amqp (`amqp`, the library under Celery/kombu), through its public calls only. It is
synchronous like the tick, and it lets a batch be written in one go and its confirms collected
afterwards: `confirm_select()` on the channel, `basic_publish` of an `amqp.Message` (which does not
wait for the confirm), then `drain_events` dispatching basic.ack / basic.nack / basic.return to the
channel's `events` callbacks. pika's BlockingChannel waits for each confirm in turn (a round trip per
message), and its SelectConnection or aio-pika would put an event loop inside a cron process that
otherwise has none.

What counts as delivered: a message the broker acked and did not return. A `mandatory` message the
broker could not route comes back as basic.return, followed by an ack: that is a failure, reported
as such. Anything not acked by the end of the batch's time (connection refused or cut, channel
closed by the broker, nack, timeout) is a failure of that delivery and is retried by the relay with
its backoff; the connection is then dropped and opened again, lazily, for the next batch.

connection.blocked: RabbitMQ tells a publisher with this frame that a memory or disk alarm stopped
it from reading the connection. Writing on would only fill socket buffers (and past the write
timeout, lose the connection), so a batch stops writing the moment the frame is read, waits
(servicing the connection) for connection.unblocked, and writes the rest then; if the batch's time
runs out first, what it did not write fails with that reason, and is retried like any failed
publish. py-amqp delivers both frames to the `on_blocked` / `on_unblocked` callbacks given to its
Connection (it advertises the `connection.blocked` capability itself, and reads what the broker sent
just before each basic_publish writes, for this very frame).
"""
from __future__ import annotations

import logging
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    import amqp

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.text import describe

log = logging.getLogger("cronbox")


def _amqp():
    """py-amqp, imported on the first forwarded batch: a tick without forward targets never pays its
    ~70 ms import (ARCHITECTURE.md: the broker client only when a broker is used)."""
    import amqp

    return amqp

CONNECT_TIMEOUT = 5.0
# Negotiated with the broker (the lower of the two wins): a connection kept through the tick's linger
# (up to a minute) stays known-alive to NATs and the broker, and a dead one is noticed between batches.
HEARTBEAT_SECONDS = 60
NO_URL = "CRONBOX_AMQP_URL is not set: nowhere to forward to"


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    user: str
    password: str
    vhost: str
    tls: bool
    ca_file: str | None = None

    def __repr__(self) -> str:  # never the password, in logs or tracebacks
        return f"{'amqps' if self.tls else 'amqp'}://{self.user}@{self.host}:{self.port}/{self.vhost}"


def parse_url(url: str) -> BrokerAddress:
    """amqp://user:password@host:port/vhost (vhost percent-encoded; empty means "/"), or amqps://
    (TLS, certificate and host name verified against the system CAs, or `?cafile=` a PEM file)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise SettingsError(f"CRONBOX_AMQP_URL is not a valid URL ({exc})") from None
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise SettingsError("CRONBOX_AMQP_URL must look like amqp://user:password@host:5672/vhost (or amqps://)")
    tls = parts.scheme == "amqps"
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    query = parse_qs(parts.query)
    return BrokerAddress(parts.hostname, port or (5671 if tls else 5672), unquote(parts.username or "guest"),
                         unquote(parts.password or "guest"), vhost, tls, (query.get("cafile") or [None])[0])


@dataclass(frozen=True)
class Outgoing:
    """One message to publish: what `amqp.Message(body, **properties)` and `basic_publish(message,
    exchange, routing_key)` are given. `properties["message_id"]` is what the broker's returns are
    matched by."""
    exchange: str
    routing_key: str
    body: bytes
    properties: dict


class ConnectionBlocked(Exception):
    """The broker sent connection.blocked while a batch was being written. Raised by the on_blocked
    callback out of the basic_publish that read the frame, before that call writes its message (as
    py-amqp raises a connection.close it reads there), so nothing is written into a blocked
    connection."""


class Batch:
    """The confirms of one batch, collected by the channel's callbacks as they arrive."""

    def __init__(self, size: int):
        self.errors: list[str | None] = [None] * size
        self.confirmed = [False] * size
        self.by_tag: dict[int, int] = {}  # delivery tag -> index, while unconfirmed
        self.returned: dict[str, str] = {}  # message_id -> why the broker returned it

    @property
    def unconfirmed(self) -> int:
        return self.confirmed.count(False)

    def on_ack(self, tag: int, multiple: bool, *, nacked: bool = False) -> None:
        tags = [t for t in self.by_tag if t <= tag] if multiple else [tag]
        for t in tags:
            index = self.by_tag.pop(t, None)
            if index is None:
                continue
            self.confirmed[index] = True
            if nacked:
                self.errors[index] = "the broker refused the message (basic.nack)"

    def on_return(self, exc, exchange: str, routing_key: str, message) -> None:
        mid = (message.properties or {}).get("message_id")
        self.returned[mid] = (f"unroutable: the broker returned the message ({exc.reply_code} {exc.reply_text}; "
                              f"exchange={exchange!r} routing_key={routing_key!r}): no queue is bound for it")

    def refuse(self, index: int, why: str) -> None:
        """Message `index` was never sent (py-amqp could not encode it): settled as failed."""
        self.confirmed[index] = True
        self.errors[index] = why

    def finish(self, ids: list[str], unconfirmed: str) -> list[str | None]:
        """Per message: None if delivered, else why not."""
        out = []
        for index, mid in enumerate(ids):
            if not self.confirmed[index]:
                out.append(unconfirmed)
            else:
                out.append(self.errors[index] or self.returned.get(mid))
        return out


class InFlight:
    """A batch handed to the broker whose confirms are still to be collected (Broker.publish). Its
    messages are written in order; `sent` of them so far (fewer than all while the broker blocks the
    connection: `collect` writes the rest once it is unblocked)."""

    def __init__(self, messages: list[Outgoing], timeout: float, *, second: bool = False):
        self.messages = messages
        self.second = second  # the part of a batch a lost connection left unconfirmed, sent again
        self.ids: list[str | None] = []
        self.sent = 0
        self.timeout = timeout
        self.end = clock.monotonic() + timeout  # no confirm counts after this
        self.batch: Batch | None = None
        self.results: list[str | None] | None = None  # known: every confirm is in, or the batch failed
        self.lost = False  # it failed on the connection itself (not the broker refusing)
        self.unconfirmed = f"no confirm from the broker within {timeout:g}s"

    @property
    def unsent(self) -> bool:
        return self.sent < len(self.messages)


class Broker:
    """One connection per process, opened on the first batch, kept across batches (the tick's
    linger too, its heartbeats serviced by `keep_alive()` on each poll), dropped on any error and
    opened again on the next batch; `close()` at exit.

    A batch is `publish()`ed (its messages written, nothing waited for) and then `collect()`ed (its
    confirms read); `send()` is the two in one go, as the forwarder (outbox.events.forwarder) sends
    each batch. At most one batch is unconfirmed at a time."""

    def __init__(self, url: str | None, *, connect_timeout: float = CONNECT_TIMEOUT,
                 heartbeat: int = HEARTBEAT_SECONDS):
        self.unusable = NO_URL if not url else None  # why nothing can be sent (a bad URL fails each batch, visibly)
        self.address = None
        if url:
            try:
                self.address = parse_url(url)
            except SettingsError as exc:
                self.unusable = str(exc)
        self.connect_timeout = connect_timeout
        self.heartbeat = heartbeat
        self._connection: amqp.Connection | None = None
        self._channel = None
        self._next_tag = 0
        self._batch: Batch | None = None  # the batch being confirmed, whose confirms the callbacks record
        self._blocked: str | None = None  # why the broker blocked the connection, until it unblocks it
        self._writing = False  # a batch's messages are being written: a connection.blocked stops it
        self.connects = 0  # connections opened (tests, bench)
        self._queues: list[str] = []  # queues declared on the open connection (declare_queue)

    def declare_queue(self, name: str, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        """Have the queue `name` exist before anything is published to it (the job publisher's queues,
        outbox.queue.publisher: a job must not bounce because no worker declared its queue yet), once
        per connection (ensure_queue), opening the connection if none is. A failure (the broker
        unreachable, the queue refused) drops the connection and raises: only that queue's batch fails,
        and the next one tries again on a fresh connection."""
        if self.address is None:
            raise SettingsError(self.unusable or NO_URL)
        if name in self._queues and self._connection is not None:
            return
        try:
            self._open(connect_timeout)
            ensure_queue(self._connection, name)
        except BaseException:
            self.close(graceful=False)
            raise
        self._queues.append(name)

    @property
    def is_open(self) -> bool:
        return self._connection is not None

    def send(self, messages: list[Outgoing], timeout: float) -> list[str | None]:
        """Publish `messages` in order, then wait up to `timeout` seconds for all their confirms.
        Returns, per message, None (confirmed, routed) or the reason it is not delivered."""
        return self.collect(self.publish(messages, timeout))

    def publish(self, messages: list[Outgoing], timeout: float) -> InFlight:
        """Write `messages` to the broker in order (mandatory, confirm mode) without waiting for
        their confirms, which count until `timeout` seconds from now (`collect`). A blocked
        connection is not written to: the messages wait for `collect`."""
        if self._batch is not None:
            raise RuntimeError("a batch is already in publication: collect it before publishing another")
        publication = InFlight(messages, timeout)
        if not messages:
            publication.results = []
        elif self.address is None:
            publication.results = [self.unusable] * len(messages)
        else:
            self._publish(publication)
        return publication

    def collect(self, publication: InFlight) -> list[str | None]:
        """Wait until `publication`'s deadline for its confirms (writing what a blocked connection held
        back once the broker unblocks it). Per message: None (confirmed, routed) or why it is not
        delivered."""
        if publication.results is None:
            try:
                while publication.unsent or publication.batch.by_tag:
                    left = publication.end - clock.monotonic()
                    if left <= 0:
                        raise socket.timeout()
                    if publication.unsent and self._blocked is None:
                        self._write(publication)
                        continue
                    self._connection.drain_events(timeout=left)
                    if self._blocked is not None:
                        self._connection.heartbeat_tick()  # a long wait: the broker still hears from us
            except Exception as exc:
                self._failed(publication, exc)
            else:
                self._batch = None
                publication.results = publication.batch.finish(publication.ids, publication.unconfirmed)
        if publication.lost and not publication.second:
            # The connection died under the batch (closed by an operator, a broker restart, a network
            # cut, or a kept one found dead): not the messages' fault, so what it left unconfirmed is
            # sent once more at once on a fresh connection, in the same attempt (a copy the broker
            # did take is a duplicate with the same message_id: delivery is at least once). Only if
            # that fails too is it a failed attempt, retried with backoff.
            left = [i for i, result in enumerate(publication.results) if result == publication.unconfirmed]
            if left:
                again = InFlight([publication.messages[i] for i in left], publication.timeout, second=True)
                self._publish(again)
                for i, result in zip(left, self.collect(again)):
                    publication.results[i] = result
        return publication.results

    def keep_alive(self) -> None:
        """Service the kept connection between batches (the tick calls it on every poll of its
        linger): read what the broker sent (its heartbeats, a connection.close, connection.blocked),
        send ours when due. A connection found dead is dropped here, so the next batch opens a
        fresh one instead of failing on it."""
        connection = self._connection
        if connection is None or self._batch is not None:
            return
        try:
            self._read_waiting()
            connection.heartbeat_tick()
        except Exception as exc:
            log.info("amqp: the idle connection is gone (%s); the next batch opens a new one", _why(exc))
            self.close(graceful=False)

    def _read_waiting(self) -> None:
        """Dispatch every frame the broker has sent, without waiting for more."""
        while True:
            try:
                self._connection.drain_events(timeout=0)
            except socket.timeout:
                return

    def _publish(self, publication: InFlight) -> None:
        try:
            self._open(min(self.connect_timeout, publication.timeout))
        except Exception as exc:
            self.close(graceful=False)
            reason = f"broker unreachable ({self.address!r}): {describe(exc, 400)}"
            log.warning("amqp: %s", reason)
            publication.results = [reason] * len(publication.messages)
            return
        publication.ids = [m.properties.get("message_id") for m in publication.messages]
        publication.batch = self._batch = Batch(len(publication.messages))
        publication.end = clock.monotonic() + publication.timeout
        try:
            self._read_waiting()  # a connection.blocked sent while the connection was idle, above all
            self._write(publication)
            crash_point("after-publish")
        except Exception as exc:
            self._failed(publication, exc)

    def _write(self, publication: InFlight) -> None:
        """basic_publish `publication`'s messages from `publication.sent` on, until all are written or the
        broker blocks the connection."""
        Message, publish, batch = _amqp().Message, self._channel.basic_publish, publication.batch
        self._writing = True
        try:
            while publication.unsent and self._blocked is None:
                index = publication.sent
                message = publication.messages[index]
                try:
                    publish(Message(message.body, **message.properties), message.exchange, message.routing_key,
                            mandatory=True)
                except ConnectionBlocked:
                    return  # this message was not written: collect() writes it once unblocked
                except (struct.error, UnicodeError) as exc:
                    # py-amqp encodes a message whole before writing any of it: a value it cannot
                    # encode (a short string over 255 bytes) fails that message alone.
                    batch.refuse(index, f"the message cannot be encoded for AMQP: {describe(exc, 400)}")
                else:
                    self._next_tag += 1
                    batch.by_tag[self._next_tag] = index
                publication.sent = index + 1
        finally:
            self._writing = False

    def _failed(self, publication: InFlight, exc: BaseException) -> None:
        """The batch ends on an error: what was confirmed stands, the rest is not delivered."""
        batch, count, blocked = publication.batch, len(publication.messages), self._blocked
        if isinstance(exc, (socket.timeout, TimeoutError)):
            if blocked is not None:
                publication.unconfirmed += f" (the broker blocked the connection: {blocked})"
            log.warning("amqp: %d of %d messages unconfirmed after %.0fs%s; dropping the connection",
                        batch.unconfirmed, count, publication.timeout,
                        f" ({count - publication.sent} not sent: the broker blocked the connection)"
                        if publication.unsent else "")
        else:
            publication.unconfirmed = f"not confirmed: {_why(exc)}"
            publication.lost = not isinstance(exc, _amqp().exceptions.ChannelError)
            log.warning("amqp: %d of %d messages unconfirmed: %s", batch.unconfirmed, count, _why(exc))
        self.close(graceful=False)
        publication.results = batch.finish(publication.ids, publication.unconfirmed)
        if blocked is not None and not publication.lost:
            for index in range(publication.sent, count):
                publication.results[index] = (f"not sent: the broker blocked the connection ({blocked}) and did not "
                                         f"unblock it within {publication.timeout:g}s")

    def _on_blocked(self, reason: str) -> None:
        """connection.blocked (py-amqp's on_blocked callback): a resource alarm on the broker."""
        if self._blocked is None:
            log.warning("amqp: the broker blocked the connection (%s: a memory or disk alarm); "
                        "publishing waits until it unblocks it", reason)
        self._blocked = reason or "connection.blocked"
        if self._writing:
            raise ConnectionBlocked(self._blocked)

    def _on_unblocked(self) -> None:
        if self._blocked is not None:
            log.info("amqp: the broker unblocked the connection")
        self._blocked = None

    def _open(self, connect_timeout: float):
        if self._connection is not None:
            return self._channel
        self._blocked = None
        self._connection = connection = open_connection(
            self.address, name="cronbox relay", timeout=connect_timeout, heartbeat=self.heartbeat,
            on_blocked=self._on_blocked, on_unblocked=self._on_unblocked)
        self._queues = []  # declared on this connection (declare_queue)
        channel = connection.channel()
        channel.confirm_select()
        channel.events["basic_ack"].add(lambda tag, multiple: self._batch and self._batch.on_ack(tag, multiple))
        channel.events["basic_nack"].add(
            lambda tag, multiple: self._batch and self._batch.on_ack(tag, multiple, nacked=True))
        channel.events["basic_return"].add(lambda *args: self._batch and self._batch.on_return(*args))
        self._channel, self._next_tag = channel, 0
        self.connects += 1
        log.info("amqp: connected to %r (heartbeat %ss)", self.address, connection.heartbeat)
        return channel

    def close(self, *, graceful: bool = True) -> None:
        """Graceful: the AMQP close handshake (at exit). Not: drop the socket at once (after an
        error the broker may not answer, and the tick must not wait on it). A batch still unconfirmed is
        abandoned: its unread confirms never count."""
        connection, self._connection, self._channel, self._batch = self._connection, None, None, None
        self._blocked, self._writing = None, False
        if connection is not None:
            close_connection(connection, graceful=graceful)


def ensure_queue(connection: "amqp.Connection", name: str) -> None:
    """The queue `name` exists: left as it is if it does (whatever its arguments: a Celery worker's, a
    quorum queue, an `x-max-priority` of the user's), else declared durable, as Celery and cronbox's
    workers declare theirs. On channels of their own: a queue that is missing closes the channel
    that asked (404), never the publisher's confirm channel."""
    channel = connection.channel()
    try:
        channel.queue_declare(name, passive=True)
    except _amqp().exceptions.NotFound:
        if not channel.is_open:  # the broker closed it (py-amqp 5.4 opens it again itself: then it is reused)
            channel = connection.channel()
        channel.queue_declare(name, durable=True, auto_delete=False)
    finally:
        if channel.is_open:
            channel.close()


def open_connection(address: BrokerAddress, *, name: str, timeout: float, heartbeat: int = 0,
                    frame_handler=None, on_blocked=None, on_unblocked=None) -> "amqp.Connection":
    """A connected py-amqp connection to `address` (TLS verified as parse_url says), named `name` in
    the broker's connection list (operators and tests find cronbox's connections by it). The one
    place a connection is made: the relay's publisher and the consumer both open theirs here.
    `frame_handler`, `on_blocked`, `on_unblocked`: py-amqp's constructor arguments of those names
    (the consumer's frame handler reads deliveries py-amqp cannot decode: outbox.amqp.unreadable;
    the publisher's callbacks follow connection.blocked)."""
    extra = {"frame_handler": frame_handler} if frame_handler is not None else {}
    tls = False
    if address.tls:
        tls = {"server_hostname": address.host, "cert_reqs": ssl.CERT_REQUIRED}
        if address.ca_file:
            tls["ca_certs"] = address.ca_file
    connection = _amqp().Connection(host=f"{address.host}:{address.port}", userid=address.user,
                                    password=address.password, virtual_host=address.vhost, ssl=tls,
                                    connect_timeout=timeout, read_timeout=timeout, write_timeout=timeout,
                                    heartbeat=heartbeat, client_properties={"connection_name": name},
                                    on_blocked=on_blocked, on_unblocked=on_unblocked, **extra)
    try:
        connection.connect()
    except BaseException:
        close_connection(connection, graceful=False)
        raise
    return connection


def close_connection(connection: "amqp.Connection", *, graceful: bool) -> None:
    """Graceful: the AMQP close handshake (at exit), falling back to dropping the socket. Not: drop
    the socket at once (after an error the broker may not answer, and nobody must wait on it)."""
    if graceful:
        try:
            connection.close()
            return
        except Exception:
            pass
    try:
        connection.collect()
    except Exception:
        pass


def _why(exc: BaseException) -> str:
    if isinstance(exc, _amqp().exceptions.ChannelError):
        return f"channel closed by the broker: {describe(exc, 400)}"
    if isinstance(exc, _amqp().exceptions.ConnectionError):
        return f"connection closed by the broker: {describe(exc, 400)}"
    return f"connection lost: {describe(exc, 400)}"
