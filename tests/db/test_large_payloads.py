"""A batch's memory is the payloads it holds (issue 35): claims bounded by payload bytes, and a run
that stopped on memory never claims (and reads) again what it gave back, for deliveries and jobs,
on every backend and claim path. The whole tick under --memory: tests/processes/test_large_payloads.py."""
from __future__ import annotations

from datetime import timedelta

import pytest

from cronbox import outbox
from cronbox.outbox.core import clock
from cronbox.outbox.engine.claim import CLAIM_BYTES
from cronbox.outbox.events import deliveries as delivery_store
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.jobs import job
from tests.helpers import fan_out

KB, MB = 1000, 1000 * 1000
# A backlog of mixed sizes (bytes of each payload's blob): small ones, large ones, one larger than a
# claim's bound, and runs that fit it several at a time.
MIXED = [KB, KB, 3 * MB, 2 * MB, 6 * MB, KB, KB, MB, MB, MB, MB, MB, KB]


def blob(size: int) -> dict:
    return {"blob": "x" * size}


def record_events(runtime, registry, sizes: list[int]) -> None:
    @consumer("big.made", name="big.take", registry=registry)
    def take(event, ctx):
        pass

    for size in sizes:  # one transaction each: a MariaDB packet holds one large row at a time
        with runtime.sessions.begin() as session:
            outbox.record(session, "big.made", blob(size))
    fan_out(runtime)


def dispatch_jobs(runtime, registry, sizes: list[int]) -> None:
    @job("big", name="big.job", registry=registry)
    def big_job(payload, ctx):
        pass

    for size in sizes:
        with runtime.sessions.begin() as session:
            big_job.dispatch(session, blob(size))


def claim_deliveries(runtime, session, limit):
    return delivery_store.claim_due(session, runtime.consumers, now=clock.utcnow() + timedelta(seconds=1),
                                    limit=limit, mode=runtime.claim_mode(), lease_margin=0)


def claim_jobs(runtime, session, limit):
    return jobstore.claim_due(session, runtime.jobs, "big", now=clock.utcnow() + timedelta(seconds=1), limit=limit,
                              mode=runtime.claim_mode(), lease_margin=0)


def claim_to_publish(runtime, session, limit):
    """The claim of a queue forwarded to the broker (outbox.queue.publisher): it holds what it publishes."""
    now = clock.utcnow() + timedelta(seconds=1)
    claimed, again, _taken = jobstore.claim_to_publish(session, runtime.jobs, "big", now=now, limit=limit,
                                                       mode=runtime.claim_mode(), lease_until=now + timedelta(minutes=5))
    return again + claimed


FAMILIES = {"deliveries": (record_events, claim_deliveries), "jobs": (dispatch_jobs, claim_jobs),
            "jobs-to-publish": (dispatch_jobs, claim_to_publish)}


def claims_until_empty(runtime, claim, limit: int = 100) -> list[list[tuple[int, int]]]:
    """Each claim (its own transaction) as [(id, bytes of the payload it read)], until one finds nothing."""
    batches = []
    while True:
        with runtime.sessions.begin() as session:
            claimed = claim(runtime, session, limit)
        if not claimed:
            return batches
        batches.append([(item.id, len(item.payload.encode())) for item in claimed])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_claim_takes_payloads_up_to_its_byte_bound_and_a_larger_one_alone(runtime, registry, family):
    make, claim = FAMILIES[family]
    make(runtime, registry, MIXED)
    batches = claims_until_empty(runtime, claim)
    sizes = [[size for _id, size in batch] for batch in batches]
    claimed = [item_id for batch in batches for item_id, _size in batch]
    assert claimed == sorted(claimed) and len(claimed) == len(set(claimed)) == len(MIXED), sizes  # all, in order
    for index, batch in enumerate(sizes):
        assert sum(batch) <= CLAIM_BYTES or len(batch) == 1, sizes  # the bound, or one payload alone
        if index + 1 < len(sizes):  # and no smaller than it: the next payload would have passed the bound
            assert sum(batch) + sizes[index + 1][0] > CLAIM_BYTES, sizes
    assert len(batches) == 5, sizes  # [1k 1k 3M] [2M] [6M] [1k 1k 1M 1M 1M 1M] [1M 1k]: five claims, not one


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_of_small_payloads_is_one_claim(runtime, registry, family):
    make, claim = FAMILIES[family]
    make(runtime, registry, [4 * KB] * 100)
    batches = claims_until_empty(runtime, claim)
    assert [len(batch) for batch in batches] == [100]
