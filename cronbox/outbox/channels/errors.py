"""How a send can end, as exceptions the worker understands.

- PermanentFailure (outbox): the provider refused this message for good (invalid number).
- SendFailed: nothing was sent (connection refused, 5xx): retry with backoff.
- OutcomeUnknown: the request went out and no answer came back (timeout). Never
  resend blindly: the next attempt looks the message up first.
- UnknownAfterLookup: outcome unknown and the lookup failed too: give up, and alert the operator.
- ChannelPaused / RetryLater (outbox): wait without using an attempt.
"""
from __future__ import annotations

from cronbox.outbox.core.errors import PermanentFailure


class SendFailed(Exception):
    """Nothing was sent; safe to try again."""


class OutcomeUnknown(Exception):
    """The request may have been delivered to the provider; look it up before resending."""


class UnknownAfterLookup(PermanentFailure):
    """The provider may have sent the message and could not be asked whether it did: never resend,
    and tell the operator (the job does, with `recipient` masked)."""

    def __init__(self, message: str, *, recipient: str, why: str):
        super().__init__(message)
        self.recipient = recipient
        self.why = why
