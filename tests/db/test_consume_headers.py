"""cronbox's count headers on an incoming message (`x-cronbox-attempts`, `x-cronbox-redeliveries`)
are written by anyone who can publish to the queue: only a count a cronbox consumer could have
written is trusted, anything else counts from 0 (generated values of every type py-amqp sends)."""
from __future__ import annotations

import itertools
from datetime import datetime
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cronbox.outbox.events import queues
from tests.db.test_consume import behaviour, consume, publish, queue, rows  # noqa: F401  (fixtures)

# What a header may say is decided before any row is written: the server changes nothing, so not
# PostgreSQL too (.ci/run's 30 minutes; consume's rows run on it in test_consume and test_consume_processes).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")

MAX_ATTEMPTS = 3  # consumers a and b of the behaviour fixture
header_values = st.one_of(
    st.integers(-2**63, 2**63 - 1), st.sampled_from([10**12, -1, 2**31, 3, MAX_ATTEMPTS, 2**63 - 1]),
    st.floats(allow_nan=True), st.booleans(), st.text(max_size=20), st.binary(max_size=20),
    st.sampled_from([Decimal("1.5"), Decimal("2"), datetime(2030, 1, 1), None, "1", b"2", 1.0, True]),
    st.dictionaries(st.text(max_size=5), st.integers(0, 5), max_size=3), st.lists(st.integers(0, 5), max_size=3))
numbers = itertools.count(100)


def trusted(value, below: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < below
    return value if ok else 0


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=header_values)
def test_a_forged_attempt_count_never_parks_early_nor_makes_ctx_attempt_huge(runtime, rabbit, queue, behaviour,
                                                                             value):
    n = next(numbers)
    behaviour.fail_a = 0
    publish(rabbit, queue, n, props={"application_headers": {
        "x-event-type": "amqp.write", "x-trace-id": "t", queues.ATTEMPTS: value}})
    consumer, result = consume(runtime, rabbit, queue, messages=1)
    assert result.exit_code == 0 and consumer.stats.parked == 0 and consumer.stats.done == 1
    attempt = trusted(value, MAX_ATTEMPTS) + 1
    assert sorted(r for r in rows(runtime) if r[1] == n) == [("a", n, attempt), ("b", n, attempt)]
    assert 1 <= attempt <= MAX_ATTEMPTS


@pytest.mark.parametrize("value", [10**12, MAX_ATTEMPTS, -5, 2.0, "2", b"2", {"n": 2}, [2], True])
def test_a_forged_attempt_count_is_not_what_a_failure_is_counted_from(runtime, rabbit, queue, behaviour, value):
    behaviour.fail_a = 1  # the first attempt fails: retried, not parked
    publish(rabbit, queue, 1, props={"application_headers": {
        "x-event-type": "amqp.write", "x-trace-id": "t", queues.ATTEMPTS: value}})
    consumer, _ = consume(runtime, rabbit, queue, messages=2)
    assert consumer.stats.parked == 0 and consumer.stats.retried == 1
    assert [c[2] for c in behaviour.calls if c[0] == "a"] == [1, 2]


def take_back(rabbit, queue) -> None:
    """Deliver the queue's head to the test and give it back unacked: the broker flags it redelivered."""
    channel = rabbit.connection.channel()
    assert channel.basic_get(queue, no_ack=False) is not None
    channel.close()


@pytest.mark.parametrize("value", [10**12, queues.MAX_REDELIVERIES, 2**63 - 1, -1, 4.0, "4", b"4", {"a": 1}, [9]])
def test_a_forged_redelivery_count_does_not_park_a_message_on_its_first_redelivery(runtime, rabbit, queue,
                                                                                  behaviour, value):
    publish(rabbit, queue, 6, props={"application_headers": {
        "x-event-type": "amqp.write", "x-trace-id": "t", queues.REDELIVERIES: value}})
    take_back(rabbit, queue)
    consumer, result = consume(runtime, rabbit, queue, messages=2)  # requeued at the back, then run
    assert result.exit_code == 0 and consumer.stats.parked == 0
    assert sorted(rows(runtime)) == [("a", 6, 1), ("b", 6, 1)]


def test_an_honest_redelivery_count_still_parks_at_the_limit(runtime, rabbit, queue, behaviour):
    publish(rabbit, queue, 7, props={"application_headers": {
        "x-event-type": "amqp.write", "x-trace-id": "t", queues.REDELIVERIES: queues.MAX_REDELIVERIES - 1}})
    take_back(rabbit, queue)
    consumer, _ = consume(runtime, rabbit, queue, messages=1)
    assert consumer.stats.parked == 1 and rows(runtime) == []


@pytest.mark.parametrize("created", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", "not a date", ""])
def test_a_created_at_header_without_a_utc_time_is_not_a_crash(runtime, rabbit, queue, behaviour, created):
    publish(rabbit, queue, 8, props={"application_headers": {
        "x-event-type": "amqp.write", "x-trace-id": "t", "x-created-at": created}})
    consumer, result = consume(runtime, rabbit, queue, messages=1)
    assert result.exit_code == 0 and consumer.stats.done == 1
