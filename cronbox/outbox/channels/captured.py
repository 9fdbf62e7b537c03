"""The test driver of every channel: CRONBOX_SMS_DRIVER=test, CRONBOX_MAIL_DRIVER=test,
CRONBOX_WEBHOOK_DRIVER=test.

Nothing leaves the process: each message a job sends is kept in memory, in the process that ran the
job, and cronbox.testing shows them to the test (`outbox.messages`: channel, recipient, text). The
kit runs jobs in the test's own process, so that is where they are; a tick run as a subprocess
keeps its messages to itself (they end with it). The attempt is recorded as every driver's is
(outcome "sent", provider "test"), never the content, and the log line is the log driver's (masked
recipient, length only).

A test makes a channel's next sends fail (`refuse`): the driver records a "not-sent" attempt and
raises SendFailed, so the job retries with its backoff, as when a provider is down.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime

from cronbox.outbox.channels import attempts
from cronbox.outbox.channels.errors import SendFailed
from cronbox.outbox.core import clock

log = logging.getLogger("cronbox")
PROVIDER = "test"


@dataclass(frozen=True)
class Message:
    """One message a job sent through a channel's test driver."""

    channel: str  # "sms", "mail" or "webhook"
    to: str  # the phone number, the e-mail address, or (webhook) the URL's scheme://host (its path may hold a token)
    text: str  # the SMS text, the e-mail's plain text, or (webhook) the JSON body posted
    subject: str | None = None  # e-mail only
    html: str | None = None  # e-mail only, when the job gave one
    idempotency_key: str = ""  # the job attempt's ctx.idempotency_key (the same on each retry)
    sent_at: datetime | None = None  # cronbox's clock when it was sent


class Captured:
    """The messages sent so far in this process, and the refusals a test asked for (thread-safe: a
    worker pool is never used by the kit, but a host's threads may send too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[Message] = []
        self._refusals: dict[str, list[str]] = {}

    def send(self, ctx, message: Message) -> None:
        """Keep `message`, or fail it if the test asked its channel to refuse."""
        with self._lock:
            waiting = self._refusals.get(message.channel)
            refusal = waiting.pop(0) if waiting else None
        if refusal is not None:
            attempts.record(ctx, channel=message.channel, recipient=message.to, outcome="not-sent",
                            provider_status=PROVIDER, detail=refusal)
            raise SendFailed(refusal)
        kept = Message(message.channel, message.to, message.text, message.subject, message.html,
                       ctx.idempotency_key, clock.utcnow())
        attempts.record(ctx, channel=message.channel, recipient=message.to, outcome="sent", provider_status=PROVIDER,
                        detail=f"{len(message.text)} characters")
        with self._lock:
            self._messages.append(kept)
        log.info("%s (test driver) to=%s chars=%d key=%s trace=%s", message.channel, attempts.mask_recipient(message.to),
                 len(message.text), ctx.idempotency_key, ctx.trace_id)

    def messages(self) -> list[Message]:
        with self._lock:
            return list(self._messages)

    def refuse(self, channel: str, reasons: list[str]) -> None:
        """The channel's next len(reasons) sends fail, each with its reason (SendFailed: retried)."""
        with self._lock:
            self._refusals.setdefault(channel, []).extend(reasons)

    def clear(self) -> None:
        """Forget the messages and the refusals not used yet (a test's start and end)."""
        with self._lock:
            self._messages.clear()
            self._refusals.clear()


SENT = Captured()  # the process's: every job of every runtime here sends through it
