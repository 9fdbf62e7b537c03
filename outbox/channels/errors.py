"""How a send can end, as exceptions the worker understands.

- PermanentFailure (outbox): the provider refused this message for good (invalid number).
- SendFailed: nothing was sent (connection refused, 5xx): retry with backoff.
- OutcomeUnknown: the request went out and no answer came back (timeout). Never
  resend blindly: the next attempt looks the message up first.
- ChannelPaused / RetryLater (outbox): wait without using an attempt.
"""
from __future__ import annotations


class SendFailed(Exception):
    """Nothing was sent; safe to try again."""


class OutcomeUnknown(Exception):
    """The request may have been delivered to the provider; look it up before resending."""
