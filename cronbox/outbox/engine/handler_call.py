"""Run one handler call and say how it ended; shared by the relay, the job worker and scheduled tasks.

Whatever the handler raises or returns becomes an Outcome whose texts are safe to
print, log and store: valid UTF-8 (lone surrogates, e.g. from os.fsdecode, are
escaped), one line, bounded. A BaseException the handler raises itself
(SystemExit, KeyboardInterrupt, GeneratorExit, its own) is a failed attempt like
any other; only cronbox's own HandlerTimeout and a real Ctrl-C (SignalInterrupt)
keep their meaning. In cron runs SIGINT/SIGTERM never raise at all: StopSignals
(outbox.engine.run_loop) turns them into a stop after the current handler.

The timeout is a SIGALRM timer (setitimer) that raises HandlerTimeout inside the
handler. Python runs a signal handler wherever the main thread happens to be, and
some places swallow what it raises: a __del__ or a weakref callback (a garbage
collection the handler set off) only prints "Exception ignored", and a handler may
catch it itself. So once the time is up the timer fires again every REFIRE seconds
until the call is over (a handler's own cleanup gets that second), and a call the
timer fired in is a timeout however it ended. The timer is armed and stopped right
around the handler's own call, where a firing never raises (_Alarm), so none escapes
into cronbox's code or the host's. A handler that takes SIGALRM for itself has no
timeout for that call; cronbox's handler is put back after it (SignalDispositions).
Calls nested inside a handler run under the outer call's timer.
Signals only reach the main thread, so in any other thread there is no timer:
handlers there must rely on their own network timeouts (the channels set them).
The lease (timeout + CRONBOX_LEASE_MARGIN) still bounds how long a stuck or killed
run keeps the work from others.
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
from typing import Any, Callable, ContextManager

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
    value: Any = None  # what the handler returned (issue 39: a job's result, outbox.queue.results)

    @property
    def ok(self) -> bool:
        return self.kind == OK


REFIRE = 1.0  # seconds between the timer's firings once the time is up, until the call is over


class _Alarm:
    """SIGALRM's handler while cronbox has it: one per process, as the signal is.

    `armed` is true only between arm() and disarm(): a firing outside it (one delivered late) does
    nothing. `fired` says the time ran out in the current call, even where the HandlerTimeout raised
    was swallowed. A firing never raises in the frames that arm and stop the timer (_call_here, arm,
    disarm): there the handler has not begun or is over, and raising would leave the timer running
    with its HandlerTimeouts landing in cronbox's code. The handler itself runs in _invoke's frame,
    so one that is a C function (time.sleep) is still interrupted."""

    def __init__(self):
        self.armed = False
        self.fired = False

    def __call__(self, signum, frame):
        if not self.armed:
            return
        self.fired = True
        if frame is not None and frame.f_code in _QUIET_FRAMES:
            return
        raise HandlerTimeout("handler ran past its timeout")

    def arm(self, timeout: float) -> None:
        self.fired = False
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, timeout, REFIRE)

    def disarm(self) -> None:
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


_ALARM = _Alarm()


def _raise_interrupt(signum, frame):
    raise SignalInterrupt()


def call_handler(fn: Callable, args: tuple, *, timeout: float, scope: Callable[[], ContextManager] | None = None,
                 dispositions: SignalDispositions | None = None) -> Outcome:
    """Call a handler and say how it went; never raises for anything the handler does.
    `scope` wraps the call (a host app's app context): its failures count as the handler's; its
    setup and teardown are outside the timer (a teardown cut short would leave the context pushed).
    `dispositions`: the signal dispositions put back after the call, kept by a caller that makes its
    calls one after another (the runner, for a batch: read once, they are what each call put back
    for the next); by default read for this call."""
    main_thread = threading.current_thread() is threading.main_thread()
    use_timer = timeout > 0 and main_thread and not _ALARM.armed  # nested: under the outer call's timer
    if not main_thread:
        dispositions = None  # signals are set in the main thread only
    elif dispositions is None:
        dispositions = SignalDispositions()
    if dispositions is not None:
        if dispositions.before[signal.SIGINT] is signal.default_int_handler:
            # Where Ctrl-C would raise KeyboardInterrupt, raise a marked one instead, so that a handler
            # raising KeyboardInterrupt itself is a failed attempt, not a stop (left in place: it acts
            # like Python's own handler).
            dispositions.install(signal.SIGINT, _raise_interrupt)
        if use_timer and dispositions.before[signal.SIGALRM] is not _ALARM:
            # Installed once and left in place (it only acts while our timer is armed): swapping
            # handlers around every call cost two syscalls per job.
            dispositions.install(signal.SIGALRM, _ALARM)
    alarm = _ALARM if use_timer else None
    if alarm is not None:
        alarm.fired = False  # (a scope failing before the call must not read the last call's)
    pid = os.getpid()
    flush_std_streams()  # a child the handler forks must not write our buffered output again
    started = time.monotonic()
    try:
        try:
            if scope is None:
                result = _call_here(fn, args, pid, alarm, timeout)
            else:
                with scope():
                    result = _call_here(fn, args, pid, alarm, timeout)
        finally:
            if dispositions is not None:
                dispositions.restore(fn)
    except SignalInterrupt:
        raise
    except BaseException as exc:  # the handler's own failure, whatever it is: record it, retry later
        seconds = time.monotonic() - started
        if isinstance(exc, HandlerTimeout) or (alarm is not None and alarm.fired):
            return Outcome(TIMEOUT, seconds, f"HandlerTimeout: no result after {timeout:g}s", _trace(exc))
        return _failed(exc, seconds)
    seconds = time.monotonic() - started
    if alarm is not None and alarm.fired:  # it returned, having swallowed its HandlerTimeout: still past its time
        return Outcome(TIMEOUT, seconds, f"HandlerTimeout: no result after {timeout:g}s (the handler returned "
                                         "after its timeout fired)")
    problem = _unrun(result)
    if problem is not None:
        return Outcome(ERROR, seconds, problem)
    return Outcome(OK, seconds, value=result)


def _failed(exc: BaseException, seconds: float) -> Outcome:
    """How a call that raised (and did not time out) went."""
    if isinstance(exc, RetryLater):
        retry_in = _retry_seconds(exc)
        if retry_in is None:
            return Outcome(ERROR, seconds,
                           f"{describe(exc, 900)} (RetryLater.seconds is not a number of seconds from 0 to "
                           f"{RETRY_LATER_MAX:.0f})", _trace(exc))
        return Outcome(RETRY_LATER, seconds, describe(exc), None, retry_in, exc)
    if isinstance(exc, PermanentFailure):
        return Outcome(PERMANENT, seconds, describe(exc), _trace(exc))
    return Outcome(ERROR, seconds, describe(exc), _trace(exc))


def _call_here(fn: Callable, args: tuple, pid: int, alarm: _Alarm | None, timeout: float):
    """The handler's call, under the timer; in a process the handler forked (no timer there: a
    child does not inherit it), whichever way the call ends, the process ends at once instead of
    returning into cronbox (outbox.engine.handler_process)."""
    if alarm is not None:
        alarm.arm(timeout)
    try:
        result = _invoke(fn, args)
    except BaseException as exc:
        if alarm is not None:
            alarm.disarm()
        leave_if_forked(pid, exc)
        raise
    if alarm is not None:
        alarm.disarm()
    leave_if_forked(pid, None)
    return result


def _invoke(fn: Callable, args: tuple):
    """The handler's own frame for the timer (see _Alarm), also when `fn` is a C function."""
    return fn(*args)


_QUIET_FRAMES = frozenset({_call_here.__code__, _Alarm.arm.__code__, _Alarm.disarm.__code__})


def _retry_seconds(exc: RetryLater) -> float | None:
    try:
        seconds = float(exc.seconds)
    except Exception:
        return None
    return seconds if math.isfinite(seconds) and 0 <= seconds <= RETRY_LATER_MAX else None


def _unrun(result) -> str | None:
    """A coroutine or generator returned means the handler's body never ran (an `async def` or a
    `yield` by mistake): that is an error, not a success. Any other return value is the
    call's value (a job stores it as its result; a consumer's is ignored)."""
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
