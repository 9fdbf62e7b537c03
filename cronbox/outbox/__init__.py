"""cronbox's outbox: events written in your transaction, delivered in-process by a cron tick.

Its names for an app are cronbox's own (README, "Python API"):

    from cronbox import consumer, record

    @consumer("appointment.paid", name="notify_patient")
    def notify(event, ctx):
        ctx.session.add(Notification(...))   # commits together with the ack

    with sessions.begin() as session:        # your domain transaction
        session.add(payment)
        record(session, "appointment.paid", {"id": 7}, key="appointment:7")

What this package adds is what an app rarely needs: its settings (`load_settings`, `Settings`) and
the runtime of a process of its own (`open_runtime`, `Runtime`), and the errors `cronbox` does not
export. Each public name has one place: `record`, `consumer`, `job`, `forward`, `Context`, `Event`
and the handler's signals are `cronbox`'s, not repeated here (docs/upgrading.md).
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cronbox.outbox.core.errors import HandlerTimeout, PayloadError, RegistrationError, SettingsError
    from cronbox.outbox.core.settings import Settings, load_settings
    from cronbox.outbox.engine.runtime import Runtime, open_runtime
    from cronbox.outbox.queue.pauses import ChannelPaused

# Each name: the module that defines it. Imported on first use (PEP 562), as in `cronbox/__init__.py`:
# importing any module of this package runs this file first, so every cron process (`queue work`
# importing the queue's modules, a host's `import cronbox.outbox.core.errors`) would otherwise load
# the runtime and the queue's tables with it.
_EXPORTS = {
    "ChannelPaused": "cronbox.outbox.queue.pauses",
    "HandlerTimeout": "cronbox.outbox.core.errors",
    "PayloadError": "cronbox.outbox.core.errors",
    "RegistrationError": "cronbox.outbox.core.errors",
    "Runtime": "cronbox.outbox.engine.runtime",
    "Settings": "cronbox.outbox.core.settings",
    "SettingsError": "cronbox.outbox.core.errors",
    "load_settings": "cronbox.outbox.core.settings",
    "open_runtime": "cronbox.outbox.engine.runtime",
}

__all__ = [
    "ChannelPaused",
    "HandlerTimeout",
    "PayloadError",
    "RegistrationError",
    "Runtime",
    "Settings",
    "SettingsError",
    "load_settings",
    "open_runtime",
]  # _EXPORTS' names


def __getattr__(name: str):
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'cronbox.outbox' has no attribute {name!r}") from None
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
