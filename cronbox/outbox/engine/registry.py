"""What a process's handler modules registered: consumers, jobs, periodic tasks, forwarded job queues,
pause listeners.

The decorators (`@cronbox.consumer`, `@cronbox.job`, `@schedule.every`, ...) add to `DEFAULT`
unless given `registry=`: it holds every declaration the process imported, from whichever module.
A standalone Runtime uses `DEFAULT` as it is (one app per process). A host app does not: two Flask
apps in one process must not run each other's handlers, so each app's runtime gets
`DEFAULT.owned_by(its CRONBOX_HANDLERS modules)`, a live view holding what those modules define
or import, plus cronbox's built-ins (`HandlerModules` says the rule). Tests build their own
`Registry()` (or a copy of what the imported modules registered in `DEFAULT`, made through its
public calls: tests/registries.py) and never touch the default's contents.

Registration is keyed by name, since names are identities stored in rows (a delivery's consumer,
a job's handler, a schedule slot's task). The same function registered twice (a module imported
again, or run as __main__) is allowed; two functions under one name are a RegistrationError.
"""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Generic, Iterable, Protocol, TypeVar

from cronbox.outbox.core.errors import RegistrationError

class Declaration(Protocol):
    """What a registry holds: a consumer, job handler, scheduled task or forward target."""
    name: str
    fn: Callable[..., Any] | None


T = TypeVar("T", bound=Declaration)

# cronbox's own declarations (the channels' jobs and pause listener, the built-in scheduled tasks):
# every app runs them, whichever module imported them first.
BUILTIN_MODULES = frozenset({"cronbox.outbox.channels.jobs", "cronbox.cron.scheduling.builtin"})


class Named(Generic[T]):
    """Items with a `name` and a function `fn`, in registration order.

    With a `source` (an app's view of DEFAULT, Registry.owned_by) it also holds the source's items
    that `keep` accepts, read live, so a built-in module imported later still shows; what is added
    to the view itself stays the view's own."""

    def __init__(self, kind: str, source: Named[T] | None = None, keep: Callable[[Any], bool] | None = None):
        self.kind = kind  # "consumer", "job", "scheduled task": for error messages
        self._by_name: dict[str, T] = {}
        self._source = source
        self._keep: Callable[[Any], bool] = keep or (lambda item: True)

    def add(self, item: T) -> None:
        existing = self.get(item.name)
        if existing is not None and _origin(existing) != _origin(item):
            raise RegistrationError(f"two {self.kind}s are named {item.name!r}; give one an explicit name=")
        self._by_name[item.name] = item

    def get(self, name: str) -> T | None:
        item = self._by_name.get(name)
        if item is None and self._source is not None:
            item = self._source.get(name)
            if item is not None and not self._keep(item):
                return None
        return item

    def names(self) -> list[str]:
        return sorted(item.name for item in self.in_order())

    def all(self) -> list[T]:
        return sorted(self.in_order(), key=lambda item: item.name)

    def in_order(self) -> list[T]:
        """In the order first registered (a view: its source's kept items, then its own)."""
        if self._source is None:
            return list(self._by_name.values())
        kept = [item for item in self._source.in_order() if item.name not in self._by_name and self._keep(item)]
        return kept + list(self._by_name.values())



class Consumers(Named):
    def for_type(self, event_type: str) -> list:
        """Consumers of this type: exact names, or patterns for forward targets (outbox.events.forward)."""
        return [c for c in self.in_order() if c.matches(event_type)]


class Jobs(Named):
    forwarded: Named | None = None  # its registry's forwarded queues (a Celery queue takes no batch member)

    def queues(self) -> list[str]:
        """Queues of registered jobs, in the order first registered (the default priority)."""
        return list(dict.fromkeys(handler.queue for handler in self.in_order()))


# Called as listener(session, settings, channel, seconds, reason) in the transaction that records a
# channel pause (the channels' admin alert subscribes; the job worker does not know any channel).
PauseListener = Callable[..., None]


class Registry:
    def __init__(self, source: Registry | None = None, keep: Callable[[Any], bool] | None = None):
        """Empty, or (`source` and `keep`: Registry.owned_by) a live view of `source`'s kept items."""
        self.consumers: Consumers = Consumers("consumer", source.consumers if source else None, keep)
        self.jobs: Jobs = Jobs("job", source.jobs if source else None, keep)
        self.tasks: Named = Named("scheduled task", source.tasks if source else None, keep)
        # Job queues served by RabbitMQ (outbox.queue.forward_jobs), keyed by the queue's name.
        self.broker_queues: Named = Named("forwarded job queue", source.broker_queues if source else None, keep)
        self.jobs.forwarded = self.broker_queues
        self._source = source
        self._pause_listeners: list[PauseListener] = []
        # Event types declared sealed (@consumer(..., sealed=True)): a view shares its source's set,
        # so a type one module seals is sealed for every producer in the process (record() asks DEFAULT).
        self.sealed_types: set[str] = source.sealed_types if source is not None else set()

    @property
    def pause_listeners(self) -> list[PauseListener]:
        """The source's (cronbox's channel alert registers there), then this registry's own."""
        inherited = self._source.pause_listeners if self._source is not None else []
        return inherited + [fn for fn in self._pause_listeners if fn not in inherited]

    def on_channel_pause(self, listener: PauseListener) -> PauseListener:
        if listener not in self._pause_listeners:
            self._pause_listeners.append(listener)
        return listener

    def owned_by(self, modules: HandlerModules) -> Registry:
        """A host app's registry: a live view of this one holding what `modules` own."""
        return Registry(self, modules.own)

    def declarations(self) -> list[tuple[str, Any]]:
        """(kind, item) for every consumer, job, scheduled task and forwarded job queue, in that order."""
        return [(named.kind, item) for named in (self.consumers, self.jobs, self.tasks, self.broker_queues)
                for item in named.in_order()]


class HandlerModules:
    """Which declarations belong to an app: the ones its CRONBOX_HANDLERS modules own.

    A module owns what is declared in it, in a module under it (`clinic.handlers` owns
    `clinic.handlers.sms`), and in the modules it imports, as its import statements name them
    (`from clinic.jobs import remind`, `from clinic import jobs`, `import clinic.jobs`, relative
    ones too; read from its source, so an import inside a function counts). cronbox's built-ins
    (BUILTIN_MODULES) belong to every app; importing other cronbox modules owns nothing (the demo's
    handlers are named in CRONBOX_HANDLERS, not imported). Read once, after the modules were
    imported (cronbox.web.state)."""

    def __init__(self, names: Iterable[str]):
        self.names = tuple(names)
        imported = {found for name in self.names for found in _imports_of(sys.modules.get(name))}
        self._modules = frozenset(m for m in (*self.names, *imported) if m != "cronbox" and not m.startswith("cronbox."))
        self._packages = tuple(name + "." for name in self.names)

    def own(self, item: Any) -> bool:
        home = module_of(item)
        return (home in BUILTIN_MODULES or home in self.names or home in self._modules
                or home.startswith(self._packages))


def _imports_of(module: ModuleType | None) -> set[str]:
    """The modules `module`'s import statements name (for `from a import b`: `a`, and `a.b` in case
    b is a module); none when its source cannot be read (a .pyc-only install: then only its own
    declarations and those of modules under it are its)."""
    path = getattr(module, "__file__", None)
    if module is None or not path or not path.endswith(".py"):
        return set()
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), module.__package__ or "")
            except (ImportError, ValueError):
                continue
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def module_of(item: Any) -> str:
    """The module that declared `item`: its function's, or (a forward target) the one calling forward()."""
    declared = getattr(item, "module", None)
    return declared or getattr(item.fn, "__module__", None) or ""


def _origin(item) -> tuple:
    """What makes two registrations the same one: the function's place, or (an item without a
    function, a forward target) what it declares."""
    declared = getattr(item, "origin", None)
    return declared if declared is not None else _where(item.fn)


def _where(fn: Callable) -> tuple:
    """A module re-imported (reloaded, or run as __main__) re-registers the same function: allowed."""
    return (getattr(fn, "__qualname__", None), getattr(getattr(fn, "__code__", None), "co_filename", None))


DEFAULT = Registry()
