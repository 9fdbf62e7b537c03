"""cronbox's outbox: events written in your transaction, delivered in-process by a cron tick.

    import outbox

    @outbox.consumer("appointment.paid", name="notify_patient")
    def notify(event, ctx):
        ctx.session.add(Notification(...))   # commits together with the ack

    with sessions.begin() as session:        # your domain transaction
        session.add(payment)
        outbox.record(session, "appointment.paid", {"id": 7}, key="appointment:7")
"""
from .consumers import consumer
from .context import Context, Event
from .errors import (
    CronboxError,
    HandlerTimeout,
    PayloadError,
    PermanentFailure,
    RegistrationError,
    RetryLater,
    SettingsError,
)
from .events import record
from .jobs import job
from .pauses import ChannelPaused
from .runtime import Runtime, open_runtime
from .settings import Settings, load_settings

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
    "job",
    "load_settings",
    "open_runtime",
    "record",
]
