"""What a process's handler modules registered: consumers, jobs, periodic tasks, pause listeners.

The decorators (`@outbox.consumer`, `@outbox.job`, `@schedule.every`, ...) add to `DEFAULT`
unless given `registry=`; a Runtime uses `DEFAULT` unless given another. Tests build their own
`Registry()` (or a copy of what the imported modules registered in `DEFAULT`, made through its
public calls: tests/registries.py) and never touch the default's contents.

Registration is keyed by name, since names are identities stored in rows (a delivery's consumer,
a job's handler, a schedule slot's task). The same function registered twice (a module imported
again, or run as __main__) is allowed; two functions under one name are a RegistrationError.
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from cronbox.outbox.core.errors import RegistrationError

T = TypeVar("T")


class Named(Generic[T]):
    """Items with a `name` and a function `fn`, in registration order."""

    def __init__(self, kind: str):
        self.kind = kind  # "consumer", "job", "scheduled task": for error messages
        self._by_name: dict[str, T] = {}

    def add(self, item: T) -> None:
        existing = self._by_name.get(item.name)
        if existing is not None and _origin(existing) != _origin(item):
            raise RegistrationError(f"two {self.kind}s are named {item.name!r}; give one an explicit name=")
        self._by_name[item.name] = item

    def get(self, name: str) -> T | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def all(self) -> list[T]:
        return [self._by_name[n] for n in self.names()]

    def in_order(self) -> list[T]:
        """In the order first registered."""
        return list(self._by_name.values())



class Consumers(Named):
    def for_type(self, event_type: str) -> list:
        """Consumers of this type: exact names, or patterns for forward targets (outbox.events.forward)."""
        return [c for c in self.in_order() if c.matches(event_type)]


class Jobs(Named):
    def queues(self) -> list[str]:
        """Queues of registered jobs, in the order first registered (the default priority)."""
        return list(dict.fromkeys(handler.queue for handler in self.in_order()))


# Called as listener(session, settings, channel, seconds, reason) in the transaction that records a
# channel pause (the channels' admin alert subscribes; the job worker does not know any channel).
PauseListener = Callable[..., None]


class Registry:
    def __init__(self):
        self.consumers: Consumers = Consumers("consumer")
        self.jobs: Jobs = Jobs("job")
        self.tasks: Named = Named("scheduled task")
        self.pause_listeners: list[PauseListener] = []

    def on_channel_pause(self, listener: PauseListener) -> PauseListener:
        if listener not in self.pause_listeners:
            self.pause_listeners.append(listener)
        return listener


def _origin(item) -> tuple:
    """What makes two registrations the same one: the function's place, or (an item without a
    function, a forward target) what it declares."""
    declared = getattr(item, "origin", None)
    return declared if declared is not None else _where(item.fn)


def _where(fn: Callable) -> tuple:
    """A module re-imported (reloaded, or run as __main__) re-registers the same function: allowed."""
    return (getattr(fn, "__qualname__", None), getattr(getattr(fn, "__code__", None), "co_filename", None))


DEFAULT = Registry()
