"""cronbox.testing: test your own consumers, jobs and periodic tasks through cronbox's real paths.

    def test_a_payment_sends_a_receipt(client, cronbox_kit):
        client.post("/appointments/7/pay", json={"amount": "120.00"})
        cronbox_kit.assert_recorded("appointment.paid", appointment_id=7)
        cronbox_kit.deliver()                      # the consumer, as the tick's relay runs it
        cronbox_kit.assert_dispatched(send_sms, to="+989121234567")
        cronbox_kit.drain()                        # the SMS job, as the worker runs it
        assert [m.text for m in cronbox_kit.outbox.sms] == ["Clinic: payment received ..."]

Your handlers run through the same claim, ack, retry and fan-out SQL as in production, on your test
database (SQLite, MariaDB, PostgreSQL), in the test's process; nothing of cronbox is mocked. A kit
(`Kit`) looks at what the code committed (`recorded`, `dispatched`, `assert_*`, `refute_*`), runs it
(`deliver`, `drain`, `perform`, `tick`), moves cronbox's clock (`clock.advance(minutes=5)`), and shows
what the channels' test driver sent (`outbox`: CRONBOX_SMS_DRIVER=test, CRONBOX_MAIL_DRIVER=test,
CRONBOX_WEBHOOK_DRIVER=test). Modes: manual (nothing runs until the test says so) and inline (what a
commit records or dispatches runs right after it).

The pytest plugin (installed with cronbox, active only in a test that asks for its fixtures) gives
`cronbox_kit` (manual) and `cronbox_inline`, on the app your `cronbox_app` fixture returns. The
functions here act on the kit started last, so helpers can `from cronbox.testing import assert_dispatched`.
docs/testing.md is the guide.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cronbox.outbox.channels.captured import Message
    from .kit import Kit, Performed, Ran, Ticked
    from .outbox import Outbox
    from .rows import DeliveryRow, DrainLoop, EventRow, JobRow, KitError
    from .timing import Clock

# Loaded on first use (PEP 562): the pytest plugin imports this package in every test session of a
# virtualenv holding cronbox, and must cost nothing (no SQLAlchemy, no Flask) until a test asks for a kit.
_EXPORTS = {
    "Kit": (".kit", "Kit"),
    "Ran": (".kit", "Ran"),
    "Performed": (".kit", "Performed"),
    "Ticked": (".kit", "Ticked"),
    "Clock": (".timing", "Clock"),
    "Outbox": (".outbox", "Outbox"),
    "Message": ("cronbox.outbox.channels.captured", "Message"),
    "EventRow": (".rows", "EventRow"),
    "DeliveryRow": (".rows", "DeliveryRow"),
    "JobRow": (".rows", "JobRow"),
    "KitError": (".rows", "KitError"),
    "DrainLoop": (".rows", "DrainLoop"),
}

__all__ = [
    "Clock",
    "DeliveryRow",
    "DrainLoop",
    "EventRow",
    "JobRow",
    "Kit",
    "KitError",
    "Message",
    "Outbox",
    "Performed",
    "Ran",
    "Ticked",
    "assert_dispatched",
    "assert_recorded",
    "clock",
    "current",
    "deliver",
    "dispatched",
    "drain",
    "inline",
    "outbox",
    "perform",
    "recorded",
    "refute_dispatched",
    "refute_recorded",
    "tick",
]


def current() -> Kit:
    """The kit started last (the cronbox_kit fixture's); KitError when none is."""
    from .kit import current as started

    return started()


def recorded(type: str | None = None, /, **payload_match: Any) -> list[EventRow]:
    """The events committed so far (of `type`, whose payload has each given key equal to its value)."""
    return current().recorded(type, **payload_match)


def dispatched(job: Any = None, /, *, queue: str | None = None, **payload_match: Any) -> list[JobRow]:
    """The jobs committed so far (of `job`: a @job function or its name; on `queue`; matching the payload)."""
    return current().dispatched(job, queue=queue, **payload_match)


def assert_recorded(type: str | None = None, /, **payload_match: Any) -> list[EventRow]:
    """The matching events; AssertionError listing the events there were when none matches."""
    return current().assert_recorded(type, **payload_match)


def refute_recorded(type: str | None = None, /, **payload_match: Any) -> None:
    """AssertionError, listing them, when a matching event was recorded."""
    current().refute_recorded(type, **payload_match)


def assert_dispatched(job: Any = None, /, *, queue: str | None = None, **payload_match: Any) -> list[JobRow]:
    """The matching jobs; AssertionError listing the jobs there were when none matches."""
    return current().assert_dispatched(job, queue=queue, **payload_match)


def refute_dispatched(job: Any = None, /, *, queue: str | None = None, **payload_match: Any) -> None:
    """AssertionError, listing them, when a matching job was dispatched."""
    current().refute_dispatched(job, queue=queue, **payload_match)


def deliver(type: str | None = None) -> Ran:
    """Run the due deliveries of in-process consumers (of `type`'s consumers only), as the relay does."""
    return current().deliver(type)


def drain(queue: str | None = None, until: datetime | timedelta | None = None) -> Ran:
    """Run the due jobs (of `queue`) and those they dispatch, as the worker does; `until`: and what comes
    due up to then, moving the clock."""
    return current().drain(queue, until)


def perform(job: Any, payload: Any = None, *, attempt: int = 1) -> Performed:
    """Call one job function once with a real Context; how it ended."""
    return current().perform(job, payload, attempt=attempt)


def tick() -> Ticked:
    """One whole tick in the test's process (scheduler, one-off runs, relay, worker), no lock wait, no linger."""
    return current().tick()


def inline(session: Any = None):
    """Inline mode for a `with` block: what a commit of `session` (default the app's db.session)
    records or dispatches runs right after it."""
    return current().inline(session)


class _CurrentClock:
    """`cronbox.testing.clock`: the started kit's clock (cronbox's frozen now)."""

    @property
    def now(self) -> datetime:
        return current().clock.now

    def advance(self, delta: timedelta | None = None, /, *, days: float = 0, hours: float = 0, minutes: float = 0,
                seconds: float = 0) -> datetime:
        return current().clock.advance(delta, days=days, hours=hours, minutes=minutes, seconds=seconds)

    def set(self, at: datetime) -> datetime:
        return current().clock.set(at)

    def __repr__(self) -> str:
        return "cronbox.testing.clock (the started kit's)"


class _CurrentOutbox:
    """`cronbox.testing.outbox`: the started kit's outbox (the test driver's messages)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(current().outbox, name)

    def __repr__(self) -> str:
        return "cronbox.testing.outbox (the started kit's)"


clock = _CurrentClock()
# It answers as the started kit's Outbox, attribute by attribute.
outbox: Outbox = _CurrentOutbox()  # type: ignore[assignment]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'cronbox.testing' has no attribute {name!r}") from None
    value = getattr(import_module(module, __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
