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
from cronbox.outbox.core.errors import (
    HandlerTimeout,
    PayloadError,
    RegistrationError,
    SettingsError,
)
from cronbox.outbox.core.settings import Settings, load_settings
from cronbox.outbox.engine.runtime import Runtime, open_runtime
from cronbox.outbox.queue.pauses import ChannelPaused

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
]
