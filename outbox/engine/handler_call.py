"""Run one handler call and say how it ended; shared by the relay, the job worker and scheduled tasks.

Whatever the handler raises or returns becomes an Outcome whose texts are safe to
print, log and store: valid UTF-8 (lone surrogates, e.g. from os.fsdecode, are
escaped), one line, bounded. A BaseException the handler raises itself
(SystemExit, KeyboardInterrupt, GeneratorExit, its own) is a failed attempt like
any other; only cronbox's own HandlerTimeout and a real Ctrl-C (SignalInterrupt)
keep their meaning. In cron runs SIGINT/SIGTERM never raise at all: StopSignals
(outbox.engine.run_loop) turns them into a stop after the current handler.

The timeout is a SIGALRM timer (setitimer) that raises HandlerTimeout inside the
handler. Signals only reach the main thread, so in any other thread there is no
timer: handlers there must rely on their own network timeouts (the channels set
them). The lease (timeout + CRONBOX_LEASE_MARGIN) still bounds how long a stuck
or killed run keeps the work from others.
"""
from __future__ import annotations

import inspect
import math
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, ContextManager

from cronbox.outbox.core.errors import HandlerTimeout, PermanentFailure, RetryLater, SignalInterrupt
from cronbox.outbox.core.text import clean_text, describe
from cronbox.outbox.engine.handler_process import SignalDispositions, flush_std_streams, leave_if_forked

OK, RETRY_LATER, PERMANENT, ERROR, TIMEOUT = "ok", "retry-later", "permanent", "error", "timeout"
TRACE_MAX = 8000
RETRY_LATER_MAX = 366 * 86400.0  # further than this is a bug, and near datetime.max it overflows


@dataclass(frozen=True)
class Outcome:
    kind: str
    seconds: float  # how long the handler ran
    error: str | None = None  # "ExceptionClass: message", never the payload; see describe()
    traceback: str | None = None
    retry_in: float | None = None  # RetryLater's delay
    raised: BaseException | None = None  # the RetryLater itself (a ChannelPaused carries its channel)

    @property
    def ok(self) -> bool:
        return self.kind == OK


def _raise_timeout(signum, frame):
    raise HandlerTimeout("handler ran past its timeout")


def _raise_interrupt(signum, frame):
    raise SignalInterrupt()


def call_handler(fn: Callable, args: tuple, *, timeout: float,
                 scope: Callable[[], ContextManager] | None = None) -> Outcome:
    """Call a handler and say how it went; never raises for anything the handler does.
    `scope` wraps the call (a host app's app context): its failures count as the handler's."""
    main_thread = threading.current_thread() is threading.main_thread()
    use_timer = timeout > 0 and main_thread
    if main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        # Where Ctrl-C would raise KeyboardInterrupt, raise a marked one instead, so that a handler
        # raising KeyboardInterrupt itself is a failed attempt, not a stop (left in place: it acts
        # like Python's own handler).
        signal.signal(signal.SIGINT, _raise_interrupt)
    dispositions = SignalDispositions() if main_thread else None
    if use_timer:
        # Installed once and left in place (it only acts while our timer is armed): swapping
        # handlers around every call cost two syscalls per job.
        if signal.getsignal(signal.SIGALRM) is not _raise_timeout:
            signal.signal(signal.SIGALRM, _raise_timeout)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    pid = os.getpid()
    flush_std_streams()  # a child the handler forks must not write our buffered output again
    started = time.monotonic()
    try:
        try:
            if scope is None:
                result = _call_here(fn, args, pid)
            else:
                with scope():
                    result = _call_here(fn, args, pid)
        finally:
            if use_timer:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if dispositions is not None:
                dispositions.restore(_name_of(fn))
    except SignalInterrupt:
        raise
    except HandlerTimeout as exc:
        return Outcome(TIMEOUT, time.monotonic() - started, f"HandlerTimeout: no result after {timeout:g}s",
                       _trace(exc))
    except RetryLater as exc:
        seconds = _retry_seconds(exc)
        if seconds is None:
            return Outcome(ERROR, time.monotonic() - started,
                           f"{describe(exc, 900)} (RetryLater.seconds is not a number of seconds from 0 to "
                           f"{RETRY_LATER_MAX:.0f})", _trace(exc))
        return Outcome(RETRY_LATER, time.monotonic() - started, describe(exc), None, seconds, exc)
    except PermanentFailure as exc:
        return Outcome(PERMANENT, time.monotonic() - started, describe(exc), _trace(exc))
    except BaseException as exc:  # the handler's own failure, whatever it is: record it, retry later
        return Outcome(ERROR, time.monotonic() - started, describe(exc), _trace(exc))
    seconds = time.monotonic() - started
    problem = _unrun(result)
    if problem is not None:
        return Outcome(ERROR, seconds, problem)
    return Outcome(OK, seconds)


def _call_here(fn: Callable, args: tuple, pid: int):
    """The handler's call; in a process the handler forked, whichever way the call ends there, the
    process ends at once instead of returning into cronbox (outbox.engine.handler_process)."""
    try:
        result = fn(*args)
    except BaseException as exc:
        leave_if_forked(pid, exc)
        raise
    leave_if_forked(pid, None)
    return result


def _name_of(fn: Callable) -> str:
    return clean_text(str(getattr(fn, "__qualname__", None) or type(fn).__name__), 200)


def _retry_seconds(exc: RetryLater) -> float | None:
    try:
        seconds = float(exc.seconds)
    except Exception:
        return None
    return seconds if math.isfinite(seconds) and 0 <= seconds <= RETRY_LATER_MAX else None


def _unrun(result) -> str | None:
    """A coroutine or generator returned means the handler's body never ran (an `async def` or a
    `yield` by mistake): that is an error, not a success. Any other return value is ignored."""
    if result is None:  # nearly every handler: no inspection
        return None
    if inspect.iscoroutine(result) or inspect.isgenerator(result):
        result.close()  # no "coroutine was never awaited" warning; the body still never runs
        what = "a coroutine (async def?)" if inspect.iscoroutine(result) else "a generator (yield?)"
        return f"HandlerError: the handler returned {what}, so its body never ran; handlers must be plain functions"
    if inspect.isasyncgen(result) or inspect.isawaitable(result):
        return "HandlerError: the handler returned an awaitable, so its work never ran; handlers must be plain functions"
    return None


def _trace(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except SignalInterrupt:
        raise
    except BaseException:  # formatting calls the exception's own methods too
        return describe(exc)
    return clean_text(text[-TRACE_MAX:], TRACE_MAX, one_line=False)
