"""The messages the channels' test driver kept (cronbox.outbox.channels.captured): "one SMS to the patient"
as an assertion, with no network. The driver is a setting: CRONBOX_SMS_DRIVER=test,
CRONBOX_MAIL_DRIVER=test, CRONBOX_WEBHOOK_DRIVER=test."""
from __future__ import annotations

from cronbox.outbox.channels.captured import SENT, Message
from cronbox.outbox.channels.config import channel_config
from cronbox.outbox.core.settings import Settings

from .rows import KitError

SETTING = {"sms": "CRONBOX_SMS_DRIVER", "mail": "CRONBOX_MAIL_DRIVER", "webhook": "CRONBOX_WEBHOOK_DRIVER"}
ALIASES = {"email": "mail", "e-mail": "mail"}


class Outbox:
    """What jobs sent through the test driver in this process since the kit started (each kit starts
    with an empty outbox). Reading a channel whose driver is not `test` is a KitError: its messages
    went elsewhere (a log line, a provider), and an empty list would pass for "nothing sent"."""

    def __init__(self, settings: Settings):
        self._settings = settings

    @property
    def messages(self) -> list[Message]:
        """Every message, in the order sent, of the channels that use the test driver."""
        channels = self._testing()
        if not channels:
            raise KitError("no channel uses the test driver, so no message is captured: set CRONBOX_SMS_DRIVER=test "
                           "(and CRONBOX_MAIL_DRIVER=test, CRONBOX_WEBHOOK_DRIVER=test) in the app's config or "
                           "the test's environment")
        return [m for m in SENT.messages() if m.channel in channels]

    @property
    def sms(self) -> list[Message]:
        return self.of("sms")

    @property
    def mail(self) -> list[Message]:
        return self.of("mail")

    @property
    def webhooks(self) -> list[Message]:
        return self.of("webhook")

    def of(self, channel: str) -> list[Message]:
        """The messages of one channel ("sms", "mail" or "webhook")."""
        name = self._checked(channel)
        return [m for m in SENT.messages() if m.channel == name]

    def to(self, recipient: str) -> list[Message]:
        """The messages sent to `recipient` (a phone number or an e-mail address), on any channel."""
        return [m for m in self.messages if m.to == recipient]

    def refuse(self, channel: str, *, times: int = 1, reason: str = "refused by the test driver") -> None:
        """Make the channel's next `times` sends fail as a provider that is down would (SendFailed:
        the job retries with its backoff, the attempt is recorded "not-sent" with `reason`)."""
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            raise KitError(f"times must be a positive integer, not {times!r}")
        SENT.refuse(self._checked(channel), [reason] * times)

    def clear(self) -> None:
        """Forget the messages kept so far (and refusals not used yet)."""
        SENT.clear()

    def _testing(self) -> set[str]:
        config = channel_config(self._settings)
        drivers = {"sms": config.sms_driver, "mail": config.mail_driver, "webhook": config.webhook_driver}
        return {channel for channel, driver in drivers.items() if driver == "test"}

    def _checked(self, channel: str) -> str:
        name = ALIASES.get(channel, channel)
        if name not in SETTING:
            raise KitError(f"no channel {channel!r}: sms, mail or webhook")
        if name not in self._testing():
            raise KitError(f"the {name} channel does not use the test driver, so its messages are not captured: "
                           f"set {SETTING[name]}=test in the app's config or the test's environment")
        return name

    def __len__(self) -> int:
        return len(self.messages)

    def __repr__(self) -> str:
        return f"Outbox({len(SENT.messages())} messages)"
