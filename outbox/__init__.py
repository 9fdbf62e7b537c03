"""cronbox's outbox: events written in your transaction, delivered in-process by a cron tick.

    import outbox

    @outbox.consumer("appointment.paid", name="notify_patient")
    def notify(event, ctx):
        ctx.session.add(Notification(...))   # commits together with the ack

    with sessions.begin() as session:        # your domain transaction
        session.add(payment)
        outbox.record(session, "appointment.paid", {"id": 7}, key="appointment:7")
"""
from outbox.engine.context import Context, Event
from outbox.events.consumers import consumer
from outbox.events.forward import forward
from outbox.core.errors import (
    CronboxError,
    HandlerTimeout,
    PayloadError,
    PermanentFailure,
    RegistrationError,
    RetryLater,
    SettingsError,
)
from outbox.core.settings import Settings, load_settings
from outbox.engine.runtime import Runtime, open_runtime
from outbox.events.record import record
from outbox.queue.jobs import job
from outbox.queue.pauses import ChannelPaused

__all__ = [
    "ChannelPaused",
    "Context",
    "CronboxError",
    "Event",
    "HandlerTimeout",
    "PayloadError",
    "PermanentFailure",
    "RegistrationError",
    "RetryLater",
    "Runtime",
    "Settings",
    "SettingsError",
    "consumer",
    "forward",
    "job",
    "load_settings",
    "open_runtime",
    "record",
]
