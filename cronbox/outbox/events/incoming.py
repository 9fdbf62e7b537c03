"""A message off the broker as an event for the consumers registered for its type, or a BadMessage
with the reason it is parked instead."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from cronbox.outbox.core import clock
from cronbox.outbox.core.text import NAME_MAX, clean_text
from cronbox.outbox.engine.context import Event
from cronbox.outbox.core.sealing import EVENTS, SealError, is_sealed
from cronbox.outbox.events import queues
from cronbox.outbox.events.forward import (CREATED_HEADER, ID_HEADER, INSTALL_HEADER, KEY_HEADER, SEALED_HEADER,
                                           TRACE_HEADER, TYPE_HEADER)
from cronbox.outbox.events.placement import runs_off_broker

MAX_BODY = 1024 * 1024  # bytes; a larger message is parked as bad (events are small JSON documents)


class BadMessage(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Incoming:
    message_id: str
    type: str
    trace_id: str
    event: Event
    attempts: int  # failed attempts before this delivery (the x-cronbox-attempts header)
    consumers: list


def parse(message, registry, runtime=None) -> Incoming:
    """The message as an event for its consumers; BadMessage with the reason if it cannot be one. A
    sealed event's envelope (forwarded sealed) is opened here, in memory, under `runtime`'s keys."""
    props = message.properties or {}
    headers = headers_of(message)
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode("utf-8", "surrogatepass")
    if len(body) > MAX_BODY:
        raise BadMessage(f"body of {len(body)} bytes is over the {MAX_BODY} byte limit")
    message_id = props.get("message_id")
    if not isinstance(message_id, str) or not message_id.strip():
        raise BadMessage("no message_id")
    if len(message_id) > NAME_MAX:
        raise BadMessage(f"message_id longer than {NAME_MAX} characters")
    event_type = props.get("type") or headers.get(TYPE_HEADER)
    if not isinstance(event_type, str) or not event_type:
        raise BadMessage("no type (neither the type property nor an x-event-type header)")
    consumers = [c for c in registry.for_type(event_type) if runs_off_broker(c)]
    if not consumers:
        raise BadMessage(f"no consumer registered here for type {clean_text(event_type, NAME_MAX)!r}")
    try:
        text = body.decode("utf-8")
        if is_sealed(text):
            text = _opened(runtime, headers, event_type, text)
        payload = json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise BadMessage("body is not JSON (UTF-8)") from None
    key = headers.get(KEY_HEADER)
    event_id = headers.get(ID_HEADER)
    event = Event(event_id if isinstance(event_id, int) and not isinstance(event_id, bool) else None, event_type,
                  key if isinstance(key, str) else None, payload, _created_at(headers, props))
    attempts = queues.attempts_of(headers, below=max(c.max_attempts for c in consumers))
    return Incoming(message_id, event_type, trace_id_of(props), event, attempts, consumers)


def _opened(runtime, headers: dict, event_type: str, text: str) -> str:
    sealer = runtime.sealer() if runtime is not None else None
    if sealer is None:
        raise BadMessage("sealed payload, but no key vault is configured here")
    try:
        return sealer.open_message(headers.get(INSTALL_HEADER), EVENTS, event_type, headers.get(SEALED_HEADER), text)
    except SealError as exc:
        raise BadMessage(f"sealed payload does not open: {exc}") from None


def headers_of(message) -> dict:
    headers = (message.properties or {}).get("application_headers")
    return headers if isinstance(headers, dict) else {}


def trace_id_of(props: dict) -> str:
    headers = props.get("application_headers") if isinstance(props.get("application_headers"), dict) else {}
    trace = headers.get(TRACE_HEADER) or props.get("correlation_id")
    return clean_text(trace, 64) if isinstance(trace, str) and trace else "-"


def _created_at(headers: dict, props: dict) -> datetime:
    """Naive UTC, as the relay's events have it: x-created-at, else the timestamp property, else now."""
    text = headers.get(CREATED_HEADER)
    if isinstance(text, str):
        try:
            when = datetime.fromisoformat(text)
            return when.astimezone(timezone.utc).replace(tzinfo=None) if when.tzinfo else when
        except (ValueError, OverflowError):  # "0001-01-01T00:00+05:00" has no UTC time
            pass
    stamp = props.get("timestamp")
    if isinstance(stamp, datetime):
        return stamp.astimezone(timezone.utc).replace(tzinfo=None) if stamp.tzinfo else stamp
    return clock.utcnow()
