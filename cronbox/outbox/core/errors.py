"""One exception root for everything cronbox raises on purpose.

Each subclass carries a message that says what to do, so the command line can
print it as one line and exit non-zero without a traceback.
"""
from __future__ import annotations


class CronboxError(Exception):
    """Root of cronbox's own errors."""

    exit_code = 1


class SettingsError(CronboxError):
    """A setting in `.env` or the environment is malformed."""


class HandlerImportError(CronboxError):
    """A module named in CRONBOX_HANDLERS could not be imported."""


class RegistrationError(CronboxError):
    """A consumer, job or task was registered with bad arguments or a clashing name."""


class PayloadError(CronboxError, TypeError):
    """A payload is not plain JSON; the message names the offending key."""


class SchemaError(CronboxError):
    """The database schema is missing or older than this code."""


class LockLost(CronboxError):
    """A run's exclusive lock was lost and could not be taken back."""


class TransactionAborted(CronboxError):
    """The server refused the rest of a transaction after an error a handler caught (PostgreSQL aborts
    a transaction at its first error; its COMMIT would silently roll back): nothing of it is kept."""


class UnknownIds(CronboxError):
    """Some ids given on the command line do not exist (the others were still handled)."""

    def __init__(self, what: str, ids):
        self.ids = list(ids)
        super().__init__(f"unknown {what} id(s): {', '.join(str(i) for i in self.ids)}")


class RetryLater(Exception):
    """Raise from a consumer or job to run it again after `seconds` without using an attempt.

    For rate limits and "try later" answers: the work did not fail, it was not
    allowed to run yet.
    """

    def __init__(self, seconds: float = 60, reason: str = "retry later"):
        if seconds < 0:
            raise ValueError("RetryLater seconds must be >= 0")
        self.seconds = float(seconds)
        self.reason = reason
        super().__init__(f"{reason} (in {self.seconds:g}s)")


class PermanentFailure(Exception):
    """Raise from a consumer or job when retrying cannot help (invalid number, bad input).

    The delivery goes dead / the job fails at once, whatever attempts are left.
    """


class HandlerTimeout(BaseException):
    """Raised inside a handler by the worker's timer when it runs past its `timeout`.

    A BaseException, like KeyboardInterrupt: a handler's own `except Exception:` must not
    swallow it and run on past its lease with no timer left.
    """


class SignalInterrupt(KeyboardInterrupt):
    """A real SIGINT while a handler ran, told apart from a handler raising KeyboardInterrupt itself."""
