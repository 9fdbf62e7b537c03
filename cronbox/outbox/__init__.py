"""cronbox's outbox: events written in your transaction, delivered in-process by a cron tick.

    from cronbox import outbox

    @outbox.consumer("appointment.paid", name="notify_patient")
    def notify(event, ctx):
        ctx.session.add(Notification(...))   # commits together with the ack

    with sessions.begin() as session:        # your domain transaction
        session.add(payment)
        outbox.record(session, "appointment.paid", {"id": 7}, key="appointment:7")
"""
from cronbox.outbox.engine.context import Context, Event
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.events.forward import forward
from cronbox.outbox.core.errors import (
    CronboxError,
    HandlerTimeout,
    PayloadError,
    PermanentFailure,
    RegistrationError,
    RetryLater,
    SettingsError,
)
from cronbox.outbox.core.settings import Settings, load_settings
from cronbox.outbox.engine.runtime import Runtime, open_runtime
from cronbox.outbox.events.record import record
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.pauses import ChannelPaused

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
