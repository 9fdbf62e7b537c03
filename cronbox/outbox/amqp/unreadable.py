"""Deliveries py-amqp cannot read, caught so that one bad message never stops a queue.

py-amqp decodes a delivery's content header inside its frame handler: the short-string properties
(message_id, type, content_type, ...) strictly as UTF-8, header timestamps into datetimes, table
fields by their type letter. A publisher can put anything there, and then the handler raises
(UnicodeDecodeError, FrameSyntaxError, OverflowError, ...) before any callback of ours runs. Worse,
its per-channel state is left half-way (it still expects that message's body), so every later frame
on the channel is an UnexpectedFrame; closing the connection gives the message back unacked, it
comes first again on the next connection, and the queue is stopped for good.

py-amqp's Connection takes the frame handler as a constructor argument (`frame_handler=`), so the
consumer's connection is made with `UnreadableFrames`, which wraps py-amqp's own handler
(`amqp.method_framing.frame_handler`) and changes nothing while frames decode. When the handler
raises on a frame of a delivery, it keeps what the broker sent of that delivery (its
basic.deliver arguments, the content header as bytes, the body), swallows the rest of its body
frames, makes py-amqp's handler afresh (its state was only about that delivery: the consumer's
channel carries one content at a time), and hands an `Unreadable` to the consumer's inbound queue in
the delivery's place. The consumer parks it in Q.dead with the reason, its body and the original
property bytes in a header, and acks it by its delivery tag like any other message.

The only bytes read here are the fixed fields the AMQP 0-9-1 spec gives a content header (class,
weight, body size: 12 bytes) and basic.deliver's first arguments (through py-amqp's public
`amqp.serialization.loads`); nothing is written but through py-amqp's calls.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

from amqp.method_framing import frame_handler
from amqp.serialization import loads

METHOD, HEADER, BODY = 1, 2, 3
BASIC_DELIVER = (60, 60)
RAW_PROPERTIES = "x-cronbox-raw-properties"  # the parked copy's header: the original property bytes


@dataclass(frozen=True)
class Unreadable:
    """A delivery py-amqp could not decode: what the consumer needs to park and ack it."""
    delivery_tag: int
    redelivered: bool
    body: bytes
    raw_properties: bytes  # the content header's property flags and list, as sent
    error: str  # why py-amqp refused it (the exception's class and text)


class _Content:
    """One delivery's frames as they come on a channel, kept until it is complete."""

    def __init__(self, method: bytes):
        self.method = bytes(method)
        self.header = b""
        self.body_size = 0
        self.chunks: list[bytes] = []
        self.received = 0

    def complete(self) -> bool:
        return self.received >= self.body_size


class UnreadableFrames:
    """A py-amqp frame handler (Connection(frame_handler=...)) that turns a delivery py-amqp cannot
    decode into an Unreadable handed to `on_unreadable`, instead of an exception that leaves the
    channel unusable. Anything else it cannot read (a method that is not a delivery, a frame of no
    delivery) is raised as before."""

    def __init__(self, connection, callback, *, on_unreadable: Callable[[Unreadable], None]):
        self._connection, self._callback = connection, callback
        self._on_unreadable = on_unreadable
        self._inner = frame_handler(connection, callback)
        self._content: dict[int, _Content] = {}  # channel -> the delivery whose frames are coming
        self._skipping: dict[int, tuple[_Content, str]] = {}  # channel -> a failed delivery's rest

    @classmethod
    def factory(cls, on_unreadable: Callable[[Unreadable], None]):
        """What Connection(frame_handler=...) takes: called with (connection, callback) at connect."""
        return lambda connection, callback: cls(connection, callback, on_unreadable=on_unreadable)

    def __call__(self, frame) -> bool:
        frame_type, channel, buf = frame
        if channel in self._skipping and frame_type == BODY:
            return self._skip_body(channel, buf)
        content = self._track(frame_type, channel, buf)
        try:
            done = self._inner(frame)
        except Exception as exc:
            if content is None or frame_type not in (HEADER, BODY) or content.method[:4] != _DELIVER_SIG:
                raise
            self._inner = frame_handler(self._connection, self._callback)  # its state was that delivery's
            self._content.pop(channel, None)
            reason = f"{type(exc).__name__}: {exc}"
            if content.complete():
                self._emit(content, reason)
                return True
            self._skipping[channel] = (content, reason)
            return False
        if done and frame_type in (HEADER, BODY):
            self._content.pop(channel, None)
        return done

    def _track(self, frame_type: int, channel: int, buf) -> _Content | None:
        if frame_type == METHOD:
            if bytes(buf[:4]) == _DELIVER_SIG:
                self._content[channel] = _Content(buf)
            return None
        content = self._content.get(channel)
        if content is None:
            return None
        if frame_type == HEADER:
            content.header = bytes(buf)
            (content.body_size,) = struct.unpack_from(">Q", buf, 4)
        elif frame_type == BODY:
            content.chunks.append(buf)  # bytes from py-amqp's transport: a reference, not a copy
            content.received += len(buf)
        return content

    def _skip_body(self, channel: int, buf) -> bool:
        content, reason = self._skipping[channel]
        content.chunks.append(buf)
        content.received += len(buf)
        if not content.complete():
            return False
        del self._skipping[channel]
        self._emit(content, reason)
        return True

    def _emit(self, content: _Content, reason: str) -> None:
        _consumer_tag, tag, redelivered = loads("sLb", content.method, 4)[0]
        self._on_unreadable(Unreadable(tag, bool(redelivered), b"".join(content.chunks), content.header[12:],
                                       reason))


_DELIVER_SIG = struct.pack(">HH", *BASIC_DELIVER)
