"""The AMQP side of forwarding: one connection per process, batches published with confirms.

Client: py-amqp (`amqp`, the library under Celery/kombu). It is synchronous like the tick, and it
lets a batch be written in one go and its confirms collected afterwards: `confirm_select()` on the
channel, plain `basic_publish` (which does not wait), then `drain_events` dispatching basic.ack /
basic.nack / basic.return to callbacks. pika's BlockingChannel waits for each confirm in turn (a
round trip per message), and its SelectConnection or aio-pika would put an event loop inside a cron
process that otherwise has none.

What counts as delivered: a message the broker acked and did not return. A `mandatory` message the
broker could not route comes back as basic.return, followed by an ack: that is a failure, reported
as such. Anything not acked by the end of the batch's time (connection refused or cut, channel
closed by the broker, nack, timeout) is a failure of that delivery and is retried by the relay with
its backoff; the connection is then dropped and opened again, lazily, for the next batch.
"""
from __future__ import annotations

import logging
import socket
import ssl
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    import amqp

from outbox.core import clock
from outbox.core.errors import SettingsError
from outbox.core.faults import crash_point
from outbox.engine.handler_call import describe

log = logging.getLogger("cronbox")


def _amqp():
    """py-amqp, imported on the first forwarded batch: a tick without forward targets never pays its
    ~70 ms import (ARCHITECTURE.md: the broker client only when a broker is used)."""
    import amqp

    return amqp

CONNECT_TIMEOUT = 5.0
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
    exchange: str
    routing_key: str
    body: bytes
    properties: dict


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

    def finish(self, ids: list[str], unconfirmed: str) -> list[str | None]:
        """Per message: None if delivered, else why not."""
        out = []
        for index, mid in enumerate(ids):
            if not self.confirmed[index]:
                out.append(unconfirmed)
            else:
                out.append(self.errors[index] or self.returned.get(mid))
        return out


class Broker:
    """One connection per process, opened on the first batch, kept across batches (the tick's
    linger too), dropped on any error and opened again on the next batch; `close()` at exit."""

    def __init__(self, url: str | None, *, connect_timeout: float = CONNECT_TIMEOUT):
        self.unusable = NO_URL if not url else None  # why nothing can be sent (a bad URL fails each batch, visibly)
        self.address = None
        if url:
            try:
                self.address = parse_url(url)
            except SettingsError as exc:
                self.unusable = str(exc)
        self.connect_timeout = connect_timeout
        self._connection: amqp.Connection | None = None
        self._channel = None
        self._next_tag = 0
        self._batch: Batch | None = None
        self._lost = False  # the last batch failed on the connection itself (not the broker refusing)
        self.connects = 0  # connections opened (tests, bench)

    @property
    def is_open(self) -> bool:
        return self._connection is not None

    def send(self, messages: list[Outgoing], timeout: float) -> list[str | None]:
        """Publish `messages` in order, then wait up to `timeout` seconds for all their confirms.
        Returns, per message, None (confirmed, routed) or the reason it is not delivered."""
        if not messages:
            return []
        if self.address is None:
            return [self.unusable] * len(messages)
        reused = self._connection is not None
        self._lost = False
        results = self._send(messages, timeout)
        if reused and self._lost and all(r is not None for r in results):
            # The kept connection had died while idle (broker restart, closed by an operator, NAT
            # timeout) and nothing got through: once more on a fresh one, not a retry with backoff.
            results = self._send(messages, timeout)
        return results

    def _send(self, messages: list[Outgoing], timeout: float) -> list[str | None]:
        ids = [m.properties.get("message_id") for m in messages]
        try:
            channel = self._open(min(self.connect_timeout, timeout))
        except Exception as exc:
            self.close(graceful=False)
            reason = f"broker unreachable ({self.address!r}): {describe(exc, 400)}"
            log.warning("amqp: %s", reason)
            return [reason] * len(messages)
        batch = self._batch = Batch(len(messages))
        end = clock.monotonic() + timeout
        unconfirmed = f"no confirm from the broker within {timeout:g}s"
        try:
            with _coalesced_writes(self._connection.transport):
                for index, message in enumerate(messages):
                    self._next_tag += 1
                    batch.by_tag[self._next_tag] = index
                    channel.basic_publish(_amqp().Message(message.body, **message.properties),
                                          exchange=message.exchange, routing_key=message.routing_key, mandatory=True)
            crash_point("after-publish")
            while batch.by_tag:
                left = end - clock.monotonic()
                if left <= 0:
                    raise socket.timeout()
                self._connection.drain_events(timeout=left)
        except (socket.timeout, TimeoutError):
            log.warning("amqp: %d of %d messages unconfirmed after %.0fs; dropping the connection",
                        batch.unconfirmed, len(messages), timeout)
            self.close(graceful=False)
        except Exception as exc:
            unconfirmed = f"not confirmed: {_why(exc)}"
            self._lost = not isinstance(exc, _amqp().exceptions.ChannelError)
            log.warning("amqp: %d of %d messages unconfirmed: %s", batch.unconfirmed, len(messages), _why(exc))
            self.close(graceful=False)
        finally:
            self._batch = None
        return batch.finish(ids, unconfirmed)

    def _open(self, connect_timeout: float):
        if self._connection is not None:
            return self._channel
        self._connection = connection = open_connection(self.address, name="cronbox relay", timeout=connect_timeout)
        channel = connection.channel()
        channel.confirm_select()
        channel.events["basic_ack"].add(lambda tag, multiple: self._batch and self._batch.on_ack(tag, multiple))
        channel.events["basic_nack"].add(
            lambda tag, multiple: self._batch and self._batch.on_ack(tag, multiple, nacked=True))
        channel.events["basic_return"].add(lambda *args: self._batch and self._batch.on_return(*args))
        self._channel, self._next_tag = channel, 0
        self.connects += 1
        log.info("amqp: connected to %r", self.address)
        return channel

    def close(self, *, graceful: bool = True) -> None:
        """Graceful: the AMQP close handshake (at exit). Not: drop the socket at once (after an
        error the broker may not answer, and the tick must not wait on it)."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is None:
            return
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


def open_connection(address: BrokerAddress, *, name: str, timeout: float, heartbeat: int = 0) -> "amqp.Connection":
    """A connected py-amqp connection to `address` (TLS verified as parse_url says), named `name` in
    the broker's connection list (operators and tests find cronbox's connections by it). The one
    place a connection is made: the relay's publisher and the consumer both open theirs here."""
    tls = False
    if address.tls:
        tls = {"server_hostname": address.host, "cert_reqs": ssl.CERT_REQUIRED}
        if address.ca_file:
            tls["ca_certs"] = address.ca_file
    connection = _amqp().Connection(host=f"{address.host}:{address.port}", userid=address.user,
                                    password=address.password, virtual_host=address.vhost, ssl=tls,
                                    connect_timeout=timeout, read_timeout=timeout, write_timeout=timeout,
                                    heartbeat=heartbeat, client_properties={"connection_name": name})
    try:
        connection.connect()
    except BaseException:
        try:
            connection.collect()
        except Exception:
            pass
        raise
    return connection


FLUSH_BYTES = 256 * 1024


@contextmanager
def _coalesced_writes(transport):
    """Send a batch's frames in a few large writes instead of one system call per message (the
    largest single cost of publishing a small message with py-amqp). py-amqp writes each message's
    frames through `transport._write` (the socket's sendall, set on the instance), from a buffer it
    reuses (hence the copy); it is swapped for the batch and put back after it."""
    chunks: list[bytes] = []
    size = 0
    send = transport._write

    def collect(data) -> None:
        nonlocal size
        chunks.append(bytes(data))
        size += len(data)
        if size >= FLUSH_BYTES:
            flush()

    def flush() -> None:
        nonlocal size
        if chunks:
            data = b"".join(chunks)
            chunks.clear()
            size = 0
            send(data)

    transport._write = collect
    try:
        yield
    finally:
        transport._write = send
    flush()


def _why(exc: BaseException) -> str:
    if isinstance(exc, _amqp().exceptions.ChannelError):
        return f"channel closed by the broker: {describe(exc, 400)}"
    if isinstance(exc, _amqp().exceptions.ConnectionError):
        return f"connection closed by the broker: {describe(exc, 400)}"
    return f"connection lost: {describe(exc, 400)}"
