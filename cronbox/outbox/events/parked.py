"""The dead queue of a consumed queue, for the operator: list what is parked, move it back.

Listing takes the messages with basic.get, unacked, and gives them all back by closing the channel
(the broker requeues unacked messages at their places): looking loses nothing. Moving back
republishes a parked message to Q (publisher confirm, cronbox's attempt and reason headers
removed, so its attempts start again) and only then acks it in Q.dead; a crash between the two
leaves a copy in both, and the inbox keeps its effects to once.

The messages are taken by a consumer on a connection whose frame handler is `UnreadableFrames`, as
`amqp consume`'s: a message py-amqp cannot decode (put in Q.dead by another publisher) is listed as
unreadable (its delivery tag, size and the reason) and never moved back, and the others after it
are listed and moved as ever.
"""
from __future__ import annotations

import socket

import amqp

from cronbox.outbox.amqp.broker import BrokerAddress, open_connection
from cronbox.outbox.amqp.unreadable import Unreadable, UnreadableFrames
from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.text import clean_text, describe
from cronbox.outbox.events import queues
from cronbox.outbox.events.queues import Parked, describe_parked

TIMEOUT = 10.0
MAX_PREFETCH = 65535  # basic.qos's prefetch-count is a short
NAME = "cronbox consumer (dead queue)"


class DeadQueue:
    def __init__(self, address: BrokerAddress, queue: str):
        self.address = address
        self.queue = queue
        self.dead = queues.dead_queue(queue)
        self._arrived: list[amqp.Message | Unreadable] = []  # deliveries in the order they came
        self.unreadable: list[Unreadable] = []  # those py-amqp could not decode, among the ones taken
        try:
            self.connection = open_connection(address, name=NAME, timeout=TIMEOUT,
                                              frame_handler=UnreadableFrames.factory(self._arrived.append))
        except (OSError, amqp.exceptions.AMQPError) as exc:
            raise CronboxError(f"broker unreachable ({address!r}): {describe(exc, 300)}") from None
        self.channel = self.connection.channel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        try:
            self.connection.close()  # unacked messages go back to Q.dead, at their places
        except Exception:
            try:
                self.connection.collect()
            except Exception:
                pass

    def count(self) -> int:
        try:
            _name, messages, _consumers = self.channel.queue_declare(self.dead, passive=True)
        except amqp.exceptions.NotFound:
            raise CronboxError(f"no dead queue {self.dead!r}: nothing was ever parked for queue {self.queue!r} "
                               "(check the name)") from None
        return messages

    def _each(self, wanted: int):
        """Up to `wanted` parked messages in queue order, unacked (given back at close unless acked):
        amqp.Message, or Unreadable for one py-amqp cannot decode (kept in `unreadable` too)."""
        if wanted <= 0:
            return
        self.channel.basic_qos(0, min(wanted, MAX_PREFETCH), False)
        self.channel.basic_consume(self.dead, callback=self._arrived.append, no_ack=False)
        for _ in range(wanted):
            while not self._arrived:
                try:
                    self.connection.drain_events(timeout=TIMEOUT)
                except socket.timeout:  # fewer than counted: another consumer took some
                    return
            delivery = self._arrived.pop(0)
            if isinstance(delivery, Unreadable):
                self.unreadable.append(delivery)
            yield delivery

    def list(self, limit: int) -> tuple[list[Parked], int]:
        """Up to `limit` parked messages, and how many there are in all."""
        total = self.count()
        return [describe_unreadable(m) if isinstance(m, Unreadable) else describe_parked(m)
                for m in self._each(min(limit, total))], total

    def move_back(self, message_ids: list[str] | None) -> tuple[int, list[str]]:
        """Move the parked messages with these ids (None: all) back to Q: (how many, the ids not parked)."""
        total = self.count()
        try:
            self.channel.queue_declare(self.queue, passive=True)
        except amqp.exceptions.NotFound:
            raise CronboxError(f"queue {self.queue!r} does not exist: nothing to move the messages back to") from None
        self.channel.confirm_select()
        returned = []
        self.channel.events["basic_return"].add(lambda exc, *rest: returned.append(exc))
        wanted = None if message_ids is None else set(message_ids)
        moved, found = 0, set()
        for message in self._each(total):
            if isinstance(message, Unreadable):  # nothing to move back as it was sent: it stays parked
                continue
            mid = (message.properties or {}).get("message_id")
            if wanted is not None and mid not in wanted:
                continue
            properties = {**message.properties, "delivery_mode": 2,
                          "application_headers": queues.stamped(message.properties.get("application_headers"))}
            try:
                self.channel.basic_publish_confirm(amqp.Message(message.body, **properties), exchange="",
                                                   routing_key=self.queue, mandatory=True, confirm_timeout=TIMEOUT)
            except (socket.timeout, amqp.exceptions.MessageNacked) as exc:
                raise CronboxError(f"moved {moved}; the broker did not take message {mid!r} back "
                                   f"({describe(exc, 200)}); it stays parked") from None
            if returned:
                raise CronboxError(f"moved {moved}; queue {self.queue!r} could not take message {mid!r}; it stays parked")
            self.channel.basic_ack(message.delivery_tag)
            moved += 1
            found.add(mid)
        return moved, sorted(wanted - found) if wanted is not None else []


def describe_unreadable(delivery: Unreadable) -> Parked:
    """A parked message py-amqp cannot decode, as `amqp dead` shows it: no field of it can be read."""
    return Parked(None, None, None, f"unreadable by py-amqp (delivery {delivery.delivery_tag}, "
                  f"{len(delivery.body)} bytes): {clean_text(delivery.error, 200)}", 0, None)
