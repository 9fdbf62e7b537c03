"""A handler's timeout holds wherever its HandlerTimeout lands (outbox.engine.handler_call).

Python runs the SIGALRM handler wherever the main thread is. A HandlerTimeout raised in a __del__ or a
weakref callback (a garbage collection the handler set off, as SQLAlchemy's event registry does) is
only printed as "Exception ignored", and a handler may catch it itself. Each way, the call must still
end soon after its time and count as a timeout, never as done, and no firing may reach cronbox after
the call.

"Soon" is measured from where the handler last became interruptible (its long sleep began), not from
the call's start: on a loaded machine what comes before (a full garbage collection of the test
process) can take seconds by itself. The bounds tell apart only the failure: the handlers sleep 60 s,
which a call the timer did not end would take; a loaded machine's late wake-up is seconds."""
from __future__ import annotations

import gc
import signal
import time
import weakref

import pytest

from cronbox.outbox.core.errors import HandlerTimeout, RetryLater
from cronbox.outbox.engine.handler_call import OK, RETRY_LATER, TIMEOUT, call_handler

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

TIMEOUT_S = 0.3
LONG_S = 60  # a handler's own sleep: the call must end long before it would
sleeps_began: list[float] = []


def long_sleep() -> None:
    """The handler's sleep that only the timer can end; says when it began."""
    sleeps_began.append(time.monotonic())
    time.sleep(LONG_S)


class SlowToDie:
    """Its __del__ outlasts the handler's timeout: the first firing lands there and is swallowed."""

    def __del__(self):
        time.sleep(TIMEOUT_S * 2)


def swallowed_in_del():
    SlowToDie()  # collected at once: __del__ runs inside the handler
    long_sleep()


def swallowed_in_weakref_callback():
    class Thing:
        pass

    thing = Thing()
    keep = weakref.ref(thing, lambda ref: time.sleep(TIMEOUT_S * 2))
    del thing
    gc.collect()
    assert keep() is None
    long_sleep()


def caught_and_slept_on():
    try:
        long_sleep()
    except HandlerTimeout:
        pass
    long_sleep()


def caught_by_a_bare_except_in_a_loop():
    """Catches every firing: nothing in-process can stop it before its loop ends (the lease bounds
    it), but it still counts as a timeout."""
    sleeps_began.append(time.monotonic())
    for _ in range(10):
        try:
            time.sleep(0.1)
        except BaseException:  # noqa: B036 -- the handler's own mistake, on purpose
            pass


def caught_and_returned():
    try:
        long_sleep()
    except BaseException:  # noqa: B036
        return None


def caught_and_raised_another():
    try:
        long_sleep()
    except HandlerTimeout:
        raise RetryLater(1, "try again") from None


@pytest.mark.parametrize("handler", [swallowed_in_del, swallowed_in_weakref_callback, caught_and_slept_on,
                                     caught_by_a_bare_except_in_a_loop, caught_and_returned,
                                     caught_and_raised_another])
def test_a_swallowed_timeout_still_ends_the_call_soon_as_a_timeout(handler):
    sleeps_began.clear()
    started = time.monotonic()
    outcome = call_handler(handler, (), timeout=TIMEOUT_S)
    ended = time.monotonic()
    assert outcome.kind == TIMEOUT, outcome
    assert "no result after 0.3s" in outcome.error
    # Not the 60 s the handler would have slept: the timer's next firing ended it (one refire period
    # after its last sleep began, on a quiet machine; a loaded one wakes it seconds later). The bound
    # tells apart only that failure: a call the timer did not end sleeps LONG_S.
    since = sleeps_began[-1] if sleeps_began else started
    assert ended - since < LONG_S / 2, (ended - since, ended - started)
    time.sleep(0.3)  # the timer is off: nothing fires after the call (it would raise here)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_call_within_its_time_is_not_a_timeout_and_the_next_call_starts_clean():
    assert call_handler(caught_and_returned, (), timeout=TIMEOUT_S).kind == TIMEOUT
    assert call_handler(lambda: time.sleep(0.05), (), timeout=TIMEOUT_S).kind == OK
    outcome = call_handler(lambda: (_ for _ in ()).throw(RetryLater(2, "later")), (), timeout=TIMEOUT_S)
    assert outcome.kind == RETRY_LATER and outcome.retry_in == 2
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_failing_scope_after_a_timed_out_call_is_its_own_failure_not_a_timeout():
    assert call_handler(caught_and_returned, (), timeout=TIMEOUT_S).kind == TIMEOUT

    class Broken:
        def __enter__(self):
            raise RuntimeError("no app context")

        def __exit__(self, *exc):
            return False

    outcome = call_handler(lambda: None, (), timeout=TIMEOUT_S, scope=Broken)
    assert outcome.kind == "error" and "no app context" in outcome.error


def spin(seconds: float) -> None:
    """A handler busy in Python code (no C call to interrupt), ending right around its time."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("handler, args", [(spin, (0.001,)), (time.sleep, (0.001,)), (spin, (0.0,))])
def test_calls_ending_right_at_their_timeout_never_leave_the_timer_running(handler, args):
    """Whichever side of its time a call ends, and wherever the firing lands (the handler, or cronbox's
    frames that arm and stop the timer), the timer is off when call_handler returns: a firing left
    running would raise HandlerTimeout in cronbox's own code."""
    kinds = set()
    for timeout in [0.000001, 0.0005, 0.0009, 0.001, 0.0011, 0.0015] * 40:
        outcome = call_handler(handler, args, timeout=timeout)
        kinds.add(outcome.kind)
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0), (timeout, outcome)
    assert kinds <= {OK, TIMEOUT}
    time.sleep(0.05)  # a firing delivered late does nothing outside a call


def test_a_c_function_handler_is_interrupted_at_its_timeout():
    started = time.monotonic()
    outcome = call_handler(time.sleep, (LONG_S,), timeout=0.2)
    assert outcome.kind == TIMEOUT and time.monotonic() - started < LONG_S / 2  # not the sleep's 60 s


def test_a_handler_taking_sigalrm_for_itself_gets_cronboxs_handler_put_back():
    """Its own SIGALRM handler gets the firings (no timeout for that call), then cronbox's is back for
    the next call, which times out again as usual."""
    seen = []

    def takes_sigalrm():
        signal.signal(signal.SIGALRM, lambda signum, frame: seen.append(signum))
        time.sleep(0.5)

    call_handler(takes_sigalrm, (), timeout=0.1)
    assert seen  # the firing went to the handler's own function
    started = time.monotonic()
    assert call_handler(time.sleep, (LONG_S,), timeout=0.1).kind == TIMEOUT
    assert time.monotonic() - started < LONG_S / 2  # interrupted, not the sleep's 60 s


def test_a_call_nested_in_a_handler_runs_under_the_outer_timer():
    """The inner call (timeout 5 s) neither re-arms nor stops the outer timer: the outer call still
    ends by its own timeout, long before its LONG_S sleep would. The outer timeout is a window by
    nature: the inner call must be over before it, 2 s that a loaded machine's 0.01 s sleep meets."""
    inner = []

    def outer():
        inner.append(call_handler(time.sleep, (0.01,), timeout=5))
        time.sleep(LONG_S)

    started = time.monotonic()
    outcome = call_handler(outer, (), timeout=2)
    assert inner[0].kind == OK
    assert outcome.kind == TIMEOUT and time.monotonic() - started < LONG_S / 2
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
