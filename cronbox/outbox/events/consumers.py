"""Registration of in-process event consumers.

A consumer's identity is its name (default: module.qualname). Delivery rows
carry that name, so renaming a consumer makes a new one: set `name=` explicitly
for anything you will keep.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, cast

from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.engine.backoff import Backoff
from cronbox.outbox.engine.registry import DEFAULT, Registry

DEFAULT_BACKOFF = 5.0


@dataclass(frozen=True)
class Consumer:
    name: str
    event_type: str
    fn: Callable
    max_attempts: int
    backoff: Backoff
    timeout: float
    grouped: bool = False  # group commit: see consumer()
    runs: str | None = None  # "tick", "broker", "both"; None: unsaid (outbox.events.placement)
    sealed: bool = False  # its event type is sealed (outbox.core.sealing): see consumer()

    def matches(self, event_type: str) -> bool:
        return event_type == self.event_type


class ConsumerFunction(Protocol):
    """A function `@consumer` registered: called as before, and knows its registered name."""
    consumer_name: str

    def __call__(self, event: Any, ctx: Any, /) -> Any: ...


def consumer(event_type: str, *, name: str | None = None, max_attempts: int = 10, backoff=DEFAULT_BACKOFF,
             timeout: float = 30, grouped: bool = False, runs: str | None = None, sealed: bool = False,
             registry: Registry | None = None) -> Callable[[Callable[..., Any]], ConsumerFunction]:
    """Register `fn(event, ctx)` for events of `event_type`. Several consumers per type are fine:
    each gets its own delivery rows, retries and dead state.

    name: the consumer's identity, stored in its delivery rows (default module.qualname: set it, as
    renaming the function would make a new consumer). max_attempts: attempts before a delivery is
    dead. backoff: the first retry's delay in seconds (doubling, capped at 15 min, +-20% jitter), or a
    list of delays. timeout: seconds an attempt may run (its lease is this plus
    CRONBOX_LEASE_MARGIN). Raises `RegistrationError` (a `CronboxError`) for a bad argument or a name
    already taken by another consumer.

    runs: where it runs when its events are also forwarded to a broker: "tick" (the relay calls it),
    "broker" (`amqp consume` does), or "both"; unsaid is refused then (outbox.events.placement).

    grouped=True (group commit, for consumers that make no network calls and only write through
    ctx.session): up to CRONBOX_GROUP_MAX (50) consecutive grouped deliveries commit in one
    transaction, each handler in its own SAVEPOINT with its ack. A failing handler rolls back only
    its own writes; when the whole transaction is lost (timeout, deadlock, dropped connection) the
    others run again one per transaction, without losing an attempt. The transaction stays open at
    most CRONBOX_GROUP_MS (200 ms) past its first handler, so a web request waiting on a row lock a
    grouped handler took waits at most that long. ctx.commit_now() is refused in a grouped handler.

    sealed=True declares `event_type` sealed: every record() of it, in this process, stores its
    payload as an envelope under the app's key vault (docs/howto/sealed-payloads.md), whatever the
    producer says. Declarations never unseal: one consumer saying sealed=True is enough, and the
    others (sealed=False, the default) get the same opened payload."""
    if not isinstance(event_type, str) or not event_type or len(event_type) > NAME_MAX:
        raise RegistrationError(f"event type must be a non-empty string of at most {NAME_MAX} characters")
    if not isinstance(max_attempts, int) or max_attempts < 1:
        raise RegistrationError(f"max_attempts must be a positive integer, not {max_attempts!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise RegistrationError(f"timeout must be a positive number of seconds, not {timeout!r}")
    if not isinstance(grouped, bool):
        raise RegistrationError(f"grouped must be True or False, not {grouped!r}")
    if runs not in (None, "tick", "broker", "both"):
        raise RegistrationError(f'runs must be "tick", "broker" or "both", not {runs!r}')
    if not isinstance(sealed, bool):
        raise RegistrationError(f"sealed must be True or False, not {sealed!r}")
    policy = Backoff.of(backoff)

    def register(fn: Callable[..., Any]) -> ConsumerFunction:
        consumer_name = name or f"{fn.__module__}.{fn.__qualname__}"
        if len(consumer_name) > NAME_MAX:
            raise RegistrationError(f"consumer name {consumer_name[:40]!r}... is longer than {NAME_MAX} characters")
        (registry or DEFAULT).consumers.add(
            Consumer(consumer_name, event_type, fn, max_attempts, policy, float(timeout), grouped, runs, sealed)
        )
        if sealed:  # record() asks the process's registry (a producer may not know the consumer's)
            DEFAULT.sealed_types.add(event_type)
            (registry or DEFAULT).sealed_types.add(event_type)
        registered = cast(ConsumerFunction, fn)
        registered.consumer_name = consumer_name
        return registered

    return register
