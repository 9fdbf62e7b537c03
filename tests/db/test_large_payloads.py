"""A batch's memory is the payloads it holds (issue 35): claims bounded by payload bytes, and a run
that stopped on memory never claims (and reads) again what it gave back, for deliveries and jobs,
on every backend and claim path. The whole tick under --memory: tests/processes/test_large_payloads.py."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import event, text

from cronbox import outbox
import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.core.resources import rss_kb
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.engine.claim import CLAIM_BYTES
from cronbox.outbox.events import deliveries as delivery_store
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.events.relay import Relay
from cronbox.outbox.queue import jobstore
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from cronbox.outbox.queue.worker import Worker
from tests.helpers import deliveries, fan_out

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
            cronbox.record(session, "big.made", blob(size))
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
def test_a_payload_of_unknown_size_after_one_larger_than_the_bound_waits_for_the_next_claim(runtime, registry,
                                                                                          family):
    """A size is unknown (NULL) for a row written before migration 0013: it counts as nothing, but it
    does not ride along with a payload larger than the bound, which is claimed alone on every path
    (PostgreSQL's one-statement claim sums the sizes as it goes, the other paths stop as it does)."""
    make, claim = FAMILIES[family]
    make(runtime, registry, [6 * MB, KB, KB])
    table = "cronbox_deliveries" if family == "deliveries" else "cronbox_jobs"
    with runtime.engine.begin() as connection:
        first = connection.execute(text(f"SELECT min(id) FROM {table}")).scalar()
        assert connection.execute(text(f"UPDATE {table} SET payload_bytes = NULL WHERE id <> :first"),
                                  {"first": first}).rowcount == 2
    batches = claims_until_empty(runtime, claim)
    assert [len(batch) for batch in batches] == [1, 2], batches
    assert batches[0][0][1] > CLAIM_BYTES


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_of_small_payloads_is_one_claim(runtime, registry, family):
    make, claim = FAMILIES[family]
    make(runtime, registry, [4 * KB] * 100)
    batches = claims_until_empty(runtime, claim)
    assert [len(batch) for batch in batches] == [100]


# ---- a run stopped by its memory ---------------------------------------------------------------

BALLAST: list[bytearray] = []  # what the first handler holds: the run's RSS passes its --memory


def hold_ballast() -> None:
    if not BALLAST:  # 64 MB, every page touched; more than glibc's mmap threshold, so freed at once
        BALLAST.append(bytearray(b"\x01") * (64 * 2 ** 20))


def payload_reads(runtime, table: str, claimed: str) -> list[str]:
    """The statements that read `table`'s payloads, as they run. And the ballast let go at the run's
    release of what it did not start (the UPDATE of the `claimed` rows that gives their attempt back): the
    memory that stopped the run falls back, as it does once a stopped run drops the batch it gave back.
    Not at any earlier UPDATE: the first item's ack is one too when its handler ran the ack window
    (CRONBOX_ACK_FLUSH, 0.5 s of handler time: the ballast's 64 MB on a loaded machine), and letting the
    ballast go there would leave the run nothing to stop on."""
    reads: list[str] = []
    column = re.compile(rf"\b{table}\.payload\b")
    release = re.compile(rf"^UPDATE {claimed} SET .*\battempts=\(?{claimed}\.attempts - ", re.DOTALL)

    def watch(conn, cursor, statement, parameters, context, executemany):
        verb = statement.lstrip()[:6].upper()
        # A read is a SELECT, or PostgreSQL's one-statement claim (WITH ... UPDATE ... RETURNING payload).
        if (verb == "SELECT" or verb.startswith("WITH ")) and column.search(statement):
            reads.append(statement)
        elif verb == "UPDATE" and BALLAST and release.search(statement.lstrip()):
            BALLAST.clear()

    event.listen(runtime.engine, "after_cursor_execute", watch)
    return reads


@pytest.fixture
def ballast():
    BALLAST.clear()
    yield
    BALLAST.clear()


def memory_budget() -> Budget:
    """A budget whose --memory the claim of a few 1 MB payloads stays under and the ballast passes."""
    return Budget(max_time=60, memory_mb=rss_kb() / 1024 + 32)


def test_a_relay_stopped_by_its_memory_does_not_claim_what_it_gave_back(runtime, registry, ballast):
    @consumer("big.made", name="big.heavy", registry=registry)
    def heavy(event, ctx):
        hold_ballast()

    for _ in range(6):
        with runtime.sessions.begin() as session:
            cronbox.record(session, "big.made", blob(MB))  # four to a claim
    reads = payload_reads(runtime, "cronbox_events", "cronbox_deliveries")
    relay = Relay(runtime)
    relay.run(memory_budget())
    assert relay.stats.done == 1 and len(reads) == 1, (relay.stats, len(reads))
    assert not BALLAST, "the ballast was never let go: no release of the rest seen"
    rows = deliveries(runtime)
    assert [(d.status, d.attempts, d.claim_token) for d in rows] == [("done", 1, None)] + [("pending", 0, None)] * 5
    relay = Relay(runtime)  # the next run takes the rest
    relay.run(Budget(max_time=60, memory_mb=None))
    assert relay.stats.done == 5 and [d.status for d in deliveries(runtime)] == ["done"] * 6


def test_a_worker_stopped_by_its_memory_does_not_claim_what_it_gave_back(runtime, registry, ballast):
    @job("big", name="big.heavy", registry=registry)
    def heavy(payload, ctx):
        hold_ballast()

    ids = []
    for _ in range(6):
        with runtime.sessions.begin() as session:
            ids.append(heavy.dispatch(session, blob(MB)))
    reads = payload_reads(runtime, "cronbox_jobs", "cronbox_jobs")
    worker = Worker(runtime, ["big"])
    worker.run(memory_budget())
    assert worker.stats.done == 1 and len(reads) == 1, (worker.stats, len(reads))
    assert not BALLAST, "the ballast was never let go: no release of the rest seen"
    with runtime.sessions() as session:
        rows = [session.get(Job, job_id) for job_id in ids]
        assert [(j.status, j.attempts, j.claim_token) for j in rows] == [("done", 1, None)] + [("ready", 0, None)] * 5
