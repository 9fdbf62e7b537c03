"""record() and dispatch() refuse the same faults in their arguments with the same words
(outbox.core.inserts), before they touch the caller's session: nothing is written, nothing flushed."""
from __future__ import annotations

from datetime import timedelta

import pytest

from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.core.inserts import MAX_DELAY
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.events.record import record
from cronbox.outbox.queue.jobs import job


class Untouchable:
    """A caller's transaction that fails the test when anything is asked of it."""

    def __getattr__(self, name):
        raise AssertionError(f"the session was used ({name}) before the arguments were checked")


def _record(**arguments):
    record(Untouchable(), arguments.pop("type", "note"), {}, key=arguments.pop("key", None), **arguments)


def _dispatch(**arguments):
    probe = job("default", name="tests.probe", registry=Registry())(lambda payload, ctx: None)
    probe.dispatch(Untouchable(), {}, unique_key=arguments.pop("key", None), **arguments)


ENTRY_POINTS = {"record": (_record, "event key"), "dispatch": (_dispatch, "unique_key")}
NOT_A_DELAY = "delay must be a number of seconds from 0 to"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("delay", [True, False, -1, -0.5, timedelta(seconds=-1), float("nan"), float("inf"),
                                   float("-inf"), MAX_DELAY + 1, 10 ** 400, timedelta.max, "5", None, b"5", [5]])
def test_a_delay_that_is_no_number_of_seconds_in_range_is_refused_alike(entry, delay):
    call, _ = ENTRY_POINTS[entry]
    with pytest.raises(PayloadError) as refused:
        call(delay=delay)
    assert str(refused.value) == f"{NOT_A_DELAY} {MAX_DELAY} (a century), not {delay!r}"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("key, fault", [
    ("", "a non-empty string"), (5, "a non-empty string"), (b"k", "a non-empty string"), (True, "a non-empty string"),
    ("k\x00", "must not contain NUL characters"),  # PostgreSQL stores no NUL in text: no backend does
    ("\ud800", "must be UTF-8 text (no lone surrogates)"),  # os.fsdecode's stand-in for bytes that were not UTF-8
    ("scan\udcff", "must be UTF-8 text (no lone surrogates)"),
])
def test_a_key_that_cannot_be_stored_is_refused_alike(entry, key, fault):
    call, name = ENTRY_POINTS[entry]
    with pytest.raises(PayloadError) as refused:
        call(key=key)
    assert str(refused.value).startswith(f"{name} must be None or " if fault == "a non-empty string" else f"{name} ")
    assert fault in str(refused.value)


def test_a_key_longer_than_its_column_is_refused_by_record_and_hashed_by_dispatch():
    """An event's key is stored as given (it orders the consumer's deliveries), so it must fit the
    column; a job's unique key is stored with its handler's name, hashed when longer (jobs._stored_key)."""
    with pytest.raises(PayloadError) as refused:
        _record(key="k" * (NAME_MAX + 1))
    assert str(refused.value) == f"event key must be None or a non-empty string of at most {NAME_MAX} characters"
    with pytest.raises(AssertionError, match="the session was used"):  # checked, and on to the INSERT
        _dispatch(key="k" * (NAME_MAX + 1))


@pytest.mark.parametrize("type_", ["", None, 5, "t" * (NAME_MAX + 1)])
def test_an_event_type_is_checked_as_a_key_is_but_required(type_):
    with pytest.raises(PayloadError) as refused:
        _record(type=type_)
    assert str(refused.value) == f"event type must be a non-empty string of at most {NAME_MAX} characters"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("delay", [0, 0.0, 1, 2.5, timedelta(minutes=5), MAX_DELAY, timedelta(seconds=MAX_DELAY)])
def test_a_delay_in_range_goes_on_to_the_insert(entry, delay):
    call, _ = ENTRY_POINTS[entry]
    with pytest.raises(AssertionError, match="the session was used"):
        call(delay=delay, key="k")
