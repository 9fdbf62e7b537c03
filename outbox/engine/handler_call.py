"""Run one handler call and say how it ended; shared by the relay and the job worker.

The timeout is a SIGALRM timer (setitimer) that raises HandlerTimeout inside the
handler. Signals only reach the main thread, so in any other thread there is no
timer: handlers there must rely on their own network timeouts (the channels set
them). The lease (timeout + CRONBOX_LEASE_MARGIN) still bounds how long a stuck
or killed run keeps the work from others.
"""
from __future__ import annotations

import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable

from outbox.core.errors import HandlerTimeout, PermanentFailure, RetryLater

OK, RETRY_LATER, PERMANENT, ERROR, TIMEOUT = "ok", "retry-later", "permanent", "error", "timeout"


@dataclass(frozen=True)
class Outcome:
    kind: str
    seconds: float  # how long the handler ran
    error: str | None = None  # "ExceptionClass: message", never the payload
    traceback: str | None = None
    retry_in: float | None = None  # RetryLater's delay
    raised: BaseException | None = None  # the RetryLater itself (a ChannelPaused carries its channel)

    @property
    def ok(self) -> bool:
        return self.kind == OK


def describe(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _raise_timeout(signum, frame):
    raise HandlerTimeout("handler ran past its timeout")


def call_handler(fn: Callable, args: tuple, *, timeout: float) -> Outcome:
    use_timer = timeout > 0 and threading.current_thread() is threading.main_thread()
    if use_timer:
        # Installed once and left in place (it only acts while our timer is armed): swapping
        # handlers around every call cost two syscalls per job.
        if signal.getsignal(signal.SIGALRM) is not _raise_timeout:
            signal.signal(signal.SIGALRM, _raise_timeout)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    started = time.monotonic()
    try:
        try:
            fn(*args)
        finally:
            if use_timer:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except HandlerTimeout as exc:
        return Outcome(TIMEOUT, time.monotonic() - started, f"HandlerTimeout: no result after {timeout:g}s",
                       _trace(exc))
    except RetryLater as exc:
        return Outcome(RETRY_LATER, time.monotonic() - started, describe(exc), None, exc.seconds, exc)
    except PermanentFailure as exc:
        return Outcome(PERMANENT, time.monotonic() - started, describe(exc), _trace(exc))
    except Exception as exc:  # the handler's own failure, whatever it is: record it, retry later
        return Outcome(ERROR, time.monotonic() - started, describe(exc), _trace(exc))
    return Outcome(OK, time.monotonic() - started)


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
