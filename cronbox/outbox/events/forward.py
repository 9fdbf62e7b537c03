"""Forwarding events to a message broker: the declaration and the message it becomes.

    from cronbox import forward

    forward("appointment.*", exchange="clinic")            # routing key: the event type
    forward("*", exchange="audit", routing_key="all", name="audit-feed")

A forward target is registered as a consumer like any other (same registry, same name rules): its
own delivery rows, per-key order, backoff, dead state, `outbox status/dead/retry/skip`, console and
health all apply unchanged. Only the relay treats it differently: instead of calling a function it
publishes the claimed batch to CRONBOX_AMQP_URL and acks each delivery once the broker confirmed it
(outbox/amqp/broker.py).

The message carries the event exactly as recorded: the stored JSON text as the body, and an identity
that is the same on every retry (`message_id`), so a consumer on the other side can drop duplicates
(delivery is at least once). The event id alone is not an identity: SQLite hands out a pruned row's
id again; the event's random trace id makes it unique for good.
"""
from __future__ import annotations

import fnmatch
import inspect
from dataclasses import dataclass
from datetime import timezone
from typing import Callable

from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.engine.backoff import Backoff
from cronbox.outbox.core.sealing import is_sealed
from cronbox.outbox.engine.registry import DEFAULT, Registry
from cronbox.outbox.amqp.broker import Outgoing

FORWARD_MAX_ATTEMPTS = 25  # with the default backoff (5 s doubling, capped at 15 min): about five hours
FORWARD_TIMEOUT = 30.0  # seconds a batch may take from the first publish to the last confirm
MAX_EXCHANGE = 127  # AMQP short strings are at most 255 bytes; keep names readable


@dataclass(frozen=True)
class Target:
    """Where a forwarded delivery goes: an exchange and how its routing key is made."""
    exchange: str
    routing_key: str | Callable | None  # None: the event type; a callable gets the Event

    def key_for(self, event) -> str:
        if self.routing_key is None:
            return event.type
        if callable(self.routing_key):
            return str(self.routing_key(event))
        return self.routing_key


@dataclass(frozen=True)
class ForwardTarget:
    """A consumer whose deliveries are published to the broker (see outbox.events.consumers.Consumer:
    the relay and the operator commands read the same fields)."""
    name: str
    event_type: str  # a pattern: "appointment.*", "*"
    target: Target
    max_attempts: int
    backoff: Backoff
    timeout: float
    fn: Callable | None = None  # nothing to call: the relay publishes instead
    module: str | None = None  # the module that called forward(): which app owns it (outbox.engine.registry)
    open: bool = False  # sealed payloads published opened (forward(open=True)); else as their envelope

    @property
    def origin(self) -> tuple:
        """Re-registering the same declaration (a module imported again) is fine; another one under
        the same name is a RegistrationError (outbox.engine.registry)."""
        key = self.target.routing_key
        key = getattr(key, "__qualname__", None) if callable(key) else key
        return ("forward", self.event_type, self.target.exchange, key)

    def matches(self, event_type: str) -> bool:
        return fnmatch.fnmatchcase(event_type, self.event_type)


def forward(event_type: str = "*", *, exchange: str, routing_key: str | Callable | None = None,
            name: str | None = None, max_attempts: int = FORWARD_MAX_ATTEMPTS, backoff=5.0,
            timeout: float = FORWARD_TIMEOUT, open: bool = False, registry: Registry | None = None) -> ForwardTarget:
    """Forward events whose type matches `event_type` (shell-style: `*`, `?`, `[...]`; default: all
    events) to `exchange` on the broker at CRONBOX_AMQP_URL. The name (default
    "amqp:<exchange>:<pattern>") is the identity stored in the delivery rows: set it explicitly if
    you may change the exchange or pattern later.

    routing_key: None (the event type), a string, or a function of the event returning one.
    max_attempts, backoff (seconds, doubling, or a list), timeout (seconds a batch waits for the
    broker's confirms): as a consumer's. open=True: a sealed payload (outbox.core.sealing) is published
    opened, as JSON; else it is published as its envelope, with the `x-cronbox-sealed` header
    (docs/howto/sealed-payloads.md), and the broker never holds its text. Returns the target. Raises `RegistrationError` (a
    `CronboxError`) for a bad argument or a name already taken."""
    if not isinstance(event_type, str) or not event_type or len(event_type) > NAME_MAX:
        raise RegistrationError(f"event type pattern must be a non-empty string of at most {NAME_MAX} characters")
    if not isinstance(exchange, str) or len(exchange) > MAX_EXCHANGE:
        raise RegistrationError(f"exchange must be a string of at most {MAX_EXCHANGE} characters")
    if routing_key is not None and not callable(routing_key) and not isinstance(routing_key, str):
        raise RegistrationError("routing_key must be None (the event type), a string or a function of the event")
    if not isinstance(max_attempts, int) or max_attempts < 1:
        raise RegistrationError(f"max_attempts must be a positive integer, not {max_attempts!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise RegistrationError(f"timeout must be a positive number of seconds, not {timeout!r}")
    target_name = name or f"amqp:{exchange}:{event_type}"
    if len(target_name) > NAME_MAX:
        raise RegistrationError(f"forward name {target_name[:40]!r}... is longer than {NAME_MAX} characters")
    caller = inspect.currentframe()
    module = caller.f_back.f_globals.get("__name__") if caller is not None and caller.f_back is not None else None
    target = ForwardTarget(target_name, event_type, Target(exchange, routing_key), max_attempts,
                           Backoff.of(backoff), float(timeout), module=module, open=bool(open))
    (registry or DEFAULT).consumers.add(target)
    return target


def is_forward(consumer) -> bool:
    return isinstance(consumer, ForwardTarget)


CONTENT_TYPE = "application/json"
APP_ID = "cronbox"
# The headers of a forwarded message, in the order they are written.
TYPE_HEADER, ID_HEADER, TRACE_HEADER, CREATED_HEADER, KEY_HEADER = (
    "x-event-type", "x-event-id", "x-trace-id", "x-created-at", "x-event-key")
# On a message whose body is a sealed payload's envelope (text, `cbxp1:…`): the event's seal id.
SEALED_HEADER, INSTALL_HEADER = "x-cronbox-sealed", "x-cronbox-install"  # and its database's install id (hex)


def message_id(event_id: int, trace_id: str) -> str:
    return f"cronbox-{event_id}-{trace_id}"


def message_of(exchange: str, routing_key: str, item, body: str | None = None) -> Outgoing:
    """The message of a claimed delivery: its payload as the body (`body`: the opened text of a sealed
    one forwarded open), message_properties(item)."""
    properties = message_properties(item)
    if body is None and is_sealed(item.payload):
        properties["application_headers"][SEALED_HEADER] = item.seal_id or ""
    return Outgoing(exchange, routing_key, (item.payload if body is None else body).encode("utf-8"), properties)


def message_properties(item) -> dict:
    """AMQP properties of a claimed delivery's message: persistent, JSON, and the event's identity,
    type, key, trace id and time. The same for every attempt of the event."""
    created = item.created_at if item.created_at.tzinfo else item.created_at.replace(tzinfo=timezone.utc)
    headers = {TYPE_HEADER: item.event_type, ID_HEADER: item.event_id, TRACE_HEADER: item.trace_id,
               CREATED_HEADER: created.isoformat(timespec="microseconds")}
    if item.key is not None:
        headers[KEY_HEADER] = item.key
    return {
        "content_type": CONTENT_TYPE,
        "content_encoding": "utf-8",
        "delivery_mode": 2,  # persistent
        "message_id": message_id(item.event_id, item.trace_id),
        "correlation_id": item.trace_id,
        "type": item.event_type,
        "timestamp": int(created.timestamp()),  # AMQP timestamps are whole seconds; x-created-at is exact
        "app_id": APP_ID,
        "application_headers": headers,
    }

