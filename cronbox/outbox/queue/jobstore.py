"""Every statement that moves jobs between states, in one place.

ready --claim--> reserved --ack--> done
                          --retry--> ready (later) --...--> failed (tries used up / permanent)
`available_at` is the due time of a ready job and the lease expiry of a reserved
one (NULL once finished); the claim reads one index range (queue, status,
available_at <= now). A reserved job whose lease ran out is due again, alone. Every change after the claim is
guarded by `claim_token`: rowcount 0 means the lease was lost.
A queue forwarded to the broker (outbox.queue.forward_jobs) has the same states: the publisher's
claim reserves its jobs under a publish token each, and a broker worker takes them (a token of its own,
the attempt counted) by the id and token their messages carry, or gives one it did not start back
(untake: under its publish token again, the attempt given back).
"""
from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import Integer, and_, bindparam, case, delete, exists, func, literal, or_, select, union_all, update
from sqlalchemy.orm import Session

from cronbox.outbox.core import paging
from cronbox.outbox.core.server import is_postgresql
from cronbox.outbox.core.text import ERROR_MAX, NAME_MAX
from cronbox.outbox.engine.claim import CLAIM_BYTES, SKIP_LOCKED, claim, within_bytes
from cronbox.outbox.engine.registry import Jobs
from cronbox.outbox.queue import batches, results
from cronbox.outbox.queue.models import DONE, FAILED, READY, RESERVED, Job

J = Job.__table__
IDEMPOTENCY_TTL_DEFAULT = 86400.0  # CRONBOX_IDEMPOTENCY_TTL: how long a finished job keeps its idempotency key
RESULT_TTL_DEFAULT = results.RESULT_TTL_DEFAULT


@dataclass(frozen=True)
class ClaimedJob:
    id: int
    queue: str
    handler: str
    payload: str
    attempts: int
    claim_token: str
    lease_until: datetime
    retry_until: datetime | None
    trace_id: str
    concurrency_group: str | None = None  # the dispatch's own (outbox.queue.groups); None: the handler's
    cost: int | None = None
    batch_id: int | None = None  # issue 39: the batch it is a member of (outbox.queue.batches)
    flow: str | None = None  # a chain's rest, or which batch's callback it is (JSON)
    seal_id: str | None = None  # when its payload is sealed (outbox.core.sealing)


def due_queues(session: Session, registry: Jobs, queues: list[str], now: datetime, *,
               always_ask: bool = False) -> list[str]:
    """Which of `queues` (in their order) have a due job of a handler registered here: one
    statement, an EXISTS per queue, each stopping at the first index entry of its (queue, status,
    available_at) range, so the worker claims only from those instead of trying every queue in
    turn (a quiet pass sent a claim per registered queue, six for the built-in ones). A plain read:
    the claim that follows re-checks and locks, so a job committed or taken meanwhile only moves
    to the next batch, as it would between two claims. With one candidate queue there is nothing
    to choose, and no statement (unless `always_ask`: the answer itself is wanted)."""
    names: dict[str, list[str]] = {}
    for handler in registry.all():
        names.setdefault(handler.queue, []).append(handler.name)
    candidates = [q for q in dict.fromkeys(queues) if q in names]
    if not candidates or (len(candidates) == 1 and not always_ask):
        return candidates
    row = session.execute(select(*(
        exists().where(J.c.queue == q, J.c.status.in_((READY, RESERVED)), J.c.available_at <= now,
                       J.c.handler.in_(names[q]))
        for q in candidates))).one()
    return [q for q, due in zip(candidates, row) if due]


def claim_due(session: Session, registry: Jobs, queue: str, *, now: datetime, limit: int, mode: str,
              lease_margin: float) -> list[ClaimedJob]:
    """Claim due jobs of one queue (handlers registered here only); counts the attempt.

    A reserved job whose lease expired is claimed alone, before fresh work: the
    worker holding it died, perhaps because of it; claimed in a batch it would
    count an attempt against every batch-mate each time it kills the worker again.
    The candidate query has no subquery, so on servers with SKIP LOCKED it locks
    directly: concurrent workers skip each other's rows instead of waiting.
    """
    handlers = [h for h in registry.all() if h.queue == queue]
    if not handlers or limit <= 0:
        return []
    if mode == SKIP_LOCKED and is_postgresql(session.get_bind()):
        return _claim_in_one_statement(session, handlers, queue, limit, now=now, lease_margin=lease_margin)
    for status, size in ((RESERVED, 1), (READY, limit)):
        claimed = _claim(session, handlers, queue, status, size, now=now, mode=mode, lease_margin=lease_margin)
        if claimed:
            return claimed
    return []


# The worker's claim of one queue, built once (outbox.engine.claim's `params`: twice a batch, building it
# cost more Python than the batch's items), its values bound at each claim.
CLAIMABLE = and_(J.c.queue == bindparam("claim_queue"), J.c.status == bindparam("claim_status"),
                 J.c.available_at <= bindparam("claim_now"))
CANDIDATES = (
    select(J.c.id, J.c.payload_bytes)  # the claim takes up to its bytes (outbox.engine.claim)
    .where(CLAIMABLE, J.c.handler.in_(bindparam("claim_handlers", expanding=True)))
    .order_by(J.c.available_at, J.c.id)
    .limit(bindparam("claim_limit", type_=Integer))
)


def _claim(session: Session, handlers, queue: str, status: str, limit: int, *, now: datetime, mode: str,
           lease_margin: float) -> list[ClaimedJob]:
    params = {"claim_queue": queue, "claim_status": status, "claim_now": now,
              "claim_handlers": [h.name for h in handlers], "claim_limit": limit}
    token = uuid.uuid4().hex
    leases = {h.name: now + timedelta(seconds=h.timeout + lease_margin) for h in handlers}
    values = {
        "claim_token": token,
        "status": RESERVED,
        "attempts": J.c.attempts + 1,
        "available_at": case(leases, value=J.c.handler, else_=max(leases.values())),
        "reserved_at": now,
    }
    ids = claim(session, J, CANDIDATES, CLAIMABLE, values, mode=mode, params=params)
    if not ids:
        return []
    return _rows(session, J.c.id.in_(ids), ids)


# PostgreSQL (SKIP LOCKED, the default mode there): the same claim as claim_due's two passes and
# outbox.engine.claim's skip-locked path, in one statement, as procrastinate fetches a job: on a worker
# woken by NOTIFY the claim is the latency to the job's start, and four statements between BEGIN and
# COMMIT (the expired-lease probe, the candidates, the UPDATE, the read-back) took 3.4-4.0 ms where
# this one with its BEGIN and COMMIT takes 1.1-1.2 (one statement in autocommit: 0.6-0.8; bench/claim_latency.py).
# `expired`: a reserved job whose lease ran out, claimed alone, before fresh work (claim_due says why).
# `fresh`: only when there is none (a one-time filter: its scan does not run otherwise).
# `picked`: of the locked candidates, in claim order, the prefix whose payloads add up to at most
# CLAIM_BYTES, the first always (outbox.engine.claim.within_bytes, as a running sum). Both CTEs lock
# with FOR UPDATE SKIP LOCKED at READ COMMITTED, as the two-statement path does: PostgreSQL re-checks a
# locked row's WHERE against its newest version, concurrent claimers skip each other's rows, and the
# UPDATE changes only rows this transaction holds. Candidates past the byte bound stay locked until the
# claim commits, as a direct lock holds them there too. RETURNING gives the rows as the read-back did.
_CLAIMING = and_(J.c.queue == bindparam("claim_queue"), J.c.available_at <= bindparam("claim_now"),
                 J.c.handler.in_(bindparam("claim_handlers", expanding=True)))
_EXPIRED = (select(J.c.id, J.c.payload_bytes, J.c.available_at).where(_CLAIMING, J.c.status == RESERVED)
            .order_by(J.c.available_at, J.c.id).limit(1).with_for_update(skip_locked=True).cte("expired"))
_FRESH = (select(J.c.id, J.c.payload_bytes, J.c.available_at)
          .where(_CLAIMING, J.c.status == READY, ~exists(select(literal(1)).select_from(_EXPIRED)))
          .order_by(J.c.available_at, J.c.id).limit(bindparam("claim_limit", type_=Integer))
          .with_for_update(skip_locked=True).cte("fresh"))
_LOCKED = union_all(select(_EXPIRED), select(_FRESH)).subquery("locked")
_IN_ORDER = (_LOCKED.c.available_at, _LOCKED.c.id)
_PICKED = select(
    _LOCKED.c.id,
    func.row_number().over(order_by=_IN_ORDER).label("n"),
    func.sum(func.coalesce(_LOCKED.c.payload_bytes, 0)).over(order_by=_IN_ORDER).label("total"),
).cte("picked")


@functools.lru_cache(maxsize=64)
def _one_statement(handler_count: int):
    """The one-statement claim for a queue of `handler_count` registered handlers, built once: its values
    (token, time, each handler's lease) are bound parameters, so a claim neither builds the statement nor
    computes its cache key again (0.4 ms of a 2 ms claim)."""
    lease = case(*((J.c.handler == bindparam(f"claim_handler_{i}"),
                    bindparam(f"claim_lease_{i}", type_=J.c.available_at.type)) for i in range(handler_count)),
                 else_=bindparam("claim_lease_max", type_=J.c.available_at.type))
    return (update(J)
            .where(J.c.id == _PICKED.c.id, or_(_PICKED.c.n == 1, _PICKED.c.total <= bindparam("claim_bytes")))
            .values(claim_token=bindparam("claim_new_token"), status=RESERVED, attempts=J.c.attempts + 1,
                    available_at=lease, reserved_at=bindparam("claim_reserved_at", type_=J.c.reserved_at.type))
            .returning(*CLAIMED, _PICKED.c.n))


def _claim_in_one_statement(session: Session, handlers, queue: str, limit: int, *, now: datetime,
                            lease_margin: float) -> list[ClaimedJob]:
    params = {"claim_queue": queue, "claim_now": now, "claim_limit": limit, "claim_bytes": CLAIM_BYTES,
              "claim_handlers": [h.name for h in handlers], "claim_new_token": uuid.uuid4().hex,
              "claim_reserved_at": now}
    leases = [now + timedelta(seconds=h.timeout + lease_margin) for h in handlers]
    for i, (handler, lease) in enumerate(zip(handlers, leases)):
        params[f"claim_handler_{i}"], params[f"claim_lease_{i}"] = handler.name, lease
    params["claim_lease_max"] = max(leases)
    rows = session.execute(_one_statement(len(handlers)), params).all()
    return [_claimed(row) for row in sorted(rows, key=lambda row: row.n)]


# ---- jobs served by the broker (outbox.queue.forward_jobs) ------------------------
# The publisher's claim and the broker worker's take. Same states: a job on the broker is `reserved`
# under a claim token of its own (one per job, never shared with the other jobs of its publish), its
# message carries id and token; a broker worker takes it by both, paired, in a short transaction of
# its own that gives it a token of the worker's own (only one copy of a message can), and every later
# write is guarded by that one. A worker that stops before starting a job it took gives it back
# (untake): reserved under its message's token again, as before the take, and the message requeued.

PAIRS_PER_STATEMENT = 300  # (id, token) pairs cost 3 parameters each: SQLite before 3.32 allows 999 a statement


def _chunks(items: list, size: int = PAIRS_PER_STATEMENT):
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _paired(pairs: list[tuple[int, str]]):
    """Rows by (id, claim token), each id with its own token only (the id list lets every server go
    by the primary key)."""
    return and_(J.c.id.in_([job_id for job_id, _token in pairs]),
                or_(*(and_(J.c.id == job_id, J.c.claim_token == token) for job_id, token in pairs)))


def _own_tokens(session: Session, ids: list[int], guard) -> None:
    """Give each of `ids` (rows this transaction holds, still matching `guard`) a claim token of its
    own: a message then names one job, and its token is worth nothing for any other (a publish's
    shared token would let any message of it take every job of it)."""
    for chunk in _chunks(ids):
        session.execute(update(J).where(J.c.id.in_(chunk), guard).values(
            claim_token=case({job_id: uuid.uuid4().hex for job_id in chunk}, value=J.c.id)))


def claim_to_publish(session: Session, registry: Jobs, queue: str, *, now: datetime, limit: int, mode: str,
                     lease_until: datetime) -> tuple[list[ClaimedJob], list[ClaimedJob], set[int]]:
    """The jobs of a forwarded queue to publish now: (claimed, again, the ids of `again` a worker had taken).

    claimed: due ready jobs, reserved with a new claim token each (`reserved_at` cleared: not taken
    yet): the claim stamps one token, then one more UPDATE gives each job its own (per
    PAIRS_PER_STATEMENT jobs), what a message naming only its own job costs.
    No attempt is counted: a job's attempt starts when a worker takes it (take).
    again: reserved jobs whose lease ran out. One never taken (its publish not confirmed, the
    publisher killed; or confirmed but not taken within republish_after) keeps its token: a copy still
    waiting on the broker stays valid, and whichever copy a worker takes first runs. One a worker took
    (`reserved_at` set) and never finished (the worker died, or is still on the jobs before it) gets a
    new token, as a claim would: the worker that took it can no longer extend its lease or ack it, so
    it never runs beside the worker that takes the new copy. Both get `lease_until` (the publish's
    time); the publisher extends it once the broker confirmed. Again first, up to `limit` in all, and
    up to CLAIM_BYTES of payloads as any claim (the fresh ones' first may pass it by one payload)."""
    handlers = [h for h in registry.all() if h.queue == queue]
    if not handlers or limit <= 0:
        return [], [], set()
    names = [h.name for h in handlers]
    expired = and_(J.c.queue == queue, J.c.status == RESERVED, J.c.available_at <= now)
    candidates = (select(J.c.id, J.c.reserved_at, J.c.payload_bytes).where(expired, J.c.handler.in_(names))
                  .order_by(J.c.available_at, J.c.id).limit(limit))
    if mode == SKIP_LOCKED:
        candidates = candidates.with_for_update(skip_locked=True)
    candidates_found = session.execute(candidates).all()
    ids = within_bytes([(row.id, row.payload_bytes) for row in candidates_found], CLAIM_BYTES)
    found = candidates_found[:len(ids)]
    taken_before = {row.id for row in found if row.reserved_at is not None}
    again: list[ClaimedJob] = []
    if ids:
        if taken_before:  # re-checked under the row lock: a row given back meanwhile is not expired
            _own_tokens(session, sorted(taken_before), and_(expired, J.c.reserved_at.is_not(None)))
        session.execute(update(J).where(J.c.id.in_(ids), expired).values(reserved_at=None, available_at=lease_until))
        # What this UPDATE changed, read back by the exact lease it wrote (microseconds on every backend):
        # in token mode (no row locks on the read) a row a worker took meanwhile is not ours to send.
        again = _rows(session, and_(J.c.id.in_(ids), J.c.status == RESERVED, J.c.available_at == lease_until), ids)
    token = uuid.uuid4().hex
    values = {"claim_token": token, "status": RESERVED, "available_at": lease_until, "reserved_at": None}
    claimable = and_(J.c.queue == queue, J.c.status == READY, J.c.available_at <= now)
    fresh = (select(J.c.id, J.c.payload_bytes).where(claimable, J.c.handler.in_(names))
             .order_by(J.c.available_at, J.c.id).limit(limit - len(again)))
    again_ids = {item.id for item in again}
    bytes_left = CLAIM_BYTES - sum(row.payload_bytes or 0 for row in found if row.id in again_ids)
    room = len(again) < limit and len(found) == len(candidates_found) and bytes_left > 0  # not cut by bytes
    claimed_ids = claim(session, J, fresh, claimable, values, mode=mode, max_bytes=bytes_left) if room else []
    if claimed_ids:
        _own_tokens(session, claimed_ids, J.c.claim_token == token)
    claimed = _rows(session, J.c.id.in_(claimed_ids), claimed_ids) if claimed_ids else []
    return claimed, again, taken_before & {item.id for item in again}


def published(session: Session, items: list[ClaimedJob], lease_until: datetime) -> int:
    """The broker has these (confirmed), or a failed publish is to be tried again then: their lease
    becomes `lease_until`, never shorter than it is. Guarded by each job's claim token: a job a worker
    took already (its message can be taken before the confirm is read) has a token of its own, and is
    left alone."""
    later = case((J.c.available_at > lease_until, J.c.available_at), else_=lease_until)
    pairs = [(item.id, item.claim_token) for item in items]
    return sum(session.execute(update(J).where(_paired(chunk), J.c.status == RESERVED)
                               .values(available_at=later)).rowcount for chunk in _chunks(pairs))


def ack_published(session: Session, items: list[ClaimedJob], now: datetime, key_ttl: float = IDEMPOTENCY_TTL_DEFAULT) -> int:
    """Done once the broker confirmed them (a Celery task message's jobs: Celery has them), guarded by
    each job's claim token as ACK is by the batch's."""
    pairs = [(item.id, item.claim_token) for item in items]
    done = {**DONE_VALUES, "finished_at": now, "idempotency_until": _key_until(now + timedelta(seconds=key_ttl))}
    return sum(session.execute(update(J).where(_paired(chunk), J.c.status == RESERVED).values(done)).rowcount
               for chunk in _chunks(pairs))


@dataclass
class Take:
    """What a broker worker's take made of each message of its batch (`named`, by position)."""
    taken: list[ClaimedJob]  # this worker's now, in message order
    not_here: list[ClaimedJob]  # valid claims of this worker's queues whose handler it does not have
    refused: dict[int, str]  # message position -> why it runs nothing (no token, no payload in it)
    taken_by: dict[int, int]  # taken job id -> the position of the message that took it


# Why a message names nothing to run here, by the job's status (the claim token compared after it).
NOT_ON_THE_BROKER = {DONE: "the job is done", FAILED: "the job failed",
                     READY: "the job is not on the broker (ready: published again when due)"}
TOKEN_NOT_THE_JOBS = "not the job's claim token (a copy taken already, a claim sent again, or forged)"
COPY_IN_BATCH = "a copy of a message taken in this batch"
TAKEN_MEANWHILE = "another worker took the job meanwhile"


def take(session: Session, registry: Jobs, queues: list[str], named: list[tuple[int, str]], *, now: datetime,
         lease_margin: float) -> Take:
    """The broker worker's claim of the jobs its messages name ((id, claim token) pairs), for a worker
    of `queues`.

    One read of the named rows says what each message may take: a job of one of `queues`, reserved
    under the very token its own message carries (never a token of another message of the batch),
    whose handler is registered here, first message first. Everything else is refused, with the
    reason, and left untouched: no such job, another queue's job (a message moved to this worker's
    broker queue), a job done, failed or ready, a token that is not the job's (a copy taken already,
    or sent again under a new claim, or forged), a second copy in the batch. A job whose handler this
    worker lacks is `not_here`. Then one UPDATE (per PAIRS_PER_STATEMENT) takes the claimable ones,
    each by its own pair: a
    token of the worker's own, the attempt counted, the handler's lease (timeout + lease_margin), as
    the database worker's claim. It re-checks every condition under the row lock (READ COMMITTED: the
    latest committed version; SQLite: BEGIN IMMEDIATE, nobody in between), so of two copies of one
    message taken at once the second takes nothing; the rows are read back only if it took fewer
    than it was given (another worker's take in between), else built from the read."""
    if not named:
        return Take([], [], {}, {})
    handlers = {h.name: h for h in registry.all() if h.queue in queues}
    ids = list(dict.fromkeys(job_id for job_id, _token in named))
    rows = {r.id: r for chunk in _chunks(ids) for r in session.execute(select(*CLAIMED, J.c.status)
                                                                        .where(J.c.id.in_(chunk)))}
    claims: dict[int, int] = {}  # job id -> the position of the message that may take it
    not_here: list[ClaimedJob] = []
    refused: dict[int, str] = {}
    for position, (job_id, token) in enumerate(named):
        row = rows.get(job_id)
        if row is None:
            refused[position] = "no such job"
        elif row.queue not in queues:
            refused[position] = f"a job of queue {row.queue}, which this worker does not run"
        elif row.status != RESERVED:
            refused[position] = NOT_ON_THE_BROKER.get(row.status, f"the job is {row.status}")
        elif row.claim_token != token:
            refused[position] = TOKEN_NOT_THE_JOBS
        elif job_id in claims or any(item.id == job_id for item in not_here):
            refused[position] = COPY_IN_BATCH
        elif row.handler not in handlers:
            not_here.append(_claimed(row))
        else:
            claims[job_id] = position
    if not claims:
        return Take([], not_here, refused, {})
    leases = {name: now + timedelta(seconds=h.timeout + lease_margin) for name, h in handlers.items()}
    mine = uuid.uuid4().hex
    pairs = [(job_id, named[position][1]) for job_id, position in claims.items()]
    values = {"claim_token": mine, "attempts": J.c.attempts + 1, "reserved_at": now,
              "available_at": case(leases, value=J.c.handler, else_=max(leases.values()))}
    took = sum(session.execute(update(J).where(_paired(chunk), J.c.status == RESERVED, J.c.queue.in_(queues),
                                               J.c.handler.in_(list(leases))).values(values)).rowcount
               for chunk in _chunks(pairs))
    order = list(claims)  # in message order
    if took == len(claims):
        taken = [replace(_claimed(rows[job_id]), attempts=rows[job_id].attempts + 1, claim_token=mine,
                         lease_until=leases[rows[job_id].handler]) for job_id in order]
    else:
        taken = _rows(session, and_(J.c.id.in_(order), J.c.claim_token == mine), order)
        for job_id in set(claims) - {item.id for item in taken}:
            refused[claims.pop(job_id)] = TAKEN_MEANWHILE
    return Take(taken, not_here, refused, claims)


def untake(session: Session, sent: dict[int, str], token: str, lease_until: datetime) -> int:
    """Give back to the broker jobs a worker took (under `token`) and did not start, the worker
    stopping: each reserved again under the token its message carried (`sent`: job id -> token),
    not taken (`reserved_at` cleared), the attempt given back, leased until `lease_until` (now +
    republish_after, as a confirmed publish), so that message, requeued, takes it again. Guarded by
    the worker's token: a job whose lease it lost is left alone."""
    pairs = list(sent.items())
    return sum(session.execute(update(J).where(_held([job_id for job_id, _t in chunk], token)).values(
        claim_token=case(dict(chunk), value=J.c.id), reserved_at=None, attempts=J.c.attempts - 1,
        available_at=lease_until)).rowcount for chunk in _chunks(pairs))


CLAIMED = (J.c.id, J.c.queue, J.c.handler, J.c.payload, J.c.attempts, J.c.claim_token, J.c.available_at,
           J.c.retry_until, J.c.trace_id, J.c.concurrency_group, J.c.cost, J.c.batch_id, J.c.flow,
           J.c.seal_id)  # a ClaimedJob's columns, in order


def _claimed(row) -> ClaimedJob:
    return ClaimedJob(*row[:len(CLAIMED)])


def _rows(session: Session, where, order: list[int]) -> list[ClaimedJob]:
    rows = session.execute(select(*CLAIMED).where(where)).all()
    position = {job_id: index for index, job_id in enumerate(order)}
    return [_claimed(r) for r in sorted(rows, key=lambda r: position.get(r.id, len(position)))]


def _held(ids, token):
    return and_(J.c.id.in_(ids), J.c.claim_token == token, J.c.status == RESERVED)


# Built once, as deliveries.ACK: the ack runs once a job when its writes commit with it.
DONE_VALUES = {"status": DONE, "available_at": None, "claim_token": None, "unique_key": None, "last_error": None,
               "error_class": None, "traceback": None}  # and finished_at


def _key_until(until):
    """A finished job keeps its idempotency key until `until` (dispatch(idempotency_key=)); NULL for the
    rest (nearly all): one more column of the same UPDATE, never a statement."""
    return case((J.c.idempotency_key.is_(None), None), else_=until)


ACK = update(J).where(_held(bindparam("ids", expanding=True), bindparam("token"))).values(
    {**DONE_VALUES, "finished_at": bindparam("now"), "idempotency_until": _key_until(bindparam("key_until"))})


def ack(session: Session, items: list, token: str, now: datetime, values: dict[int, str] | None = None, *,
        keep: float = RESULT_TTL_DEFAULT, key_ttl: float = IDEMPOTENCY_TTL_DEFAULT) -> int:
    """Done: `items` (claimed jobs of one claim `token`). An earlier attempt's error (a retry, or an
    operator's `queue retry` of a failed job) goes: a done job shows no error.

    Issue 39: jobs with a result (`values`: job id -> its JSON, kept `keep` seconds), a batch or a
    chain are acked by their own UPDATE per batch (one for those of no batch), whose rowcount says
    how many of that batch this statement made done; then, in this transaction, their results,
    chains' next steps and batch counters (outbox.queue.batches.on_done). The rest, nearly always all
    of them, take the one UPDATE as before. A short rowcount (a lease lost to another run, which then
    writes that job's outcome and its follow-ups itself) is resolved by reading back which rows this
    statement finished: its exact `finished_at`, microseconds on every backend. A finished job with
    an idempotency key keeps it `key_ttl` seconds."""
    if not items:
        return 0
    key_until = now + timedelta(seconds=key_ttl)
    values = values or {}
    special = [item for item in items if item.id in values or item.batch_id is not None or item.flow is not None]
    if not special:
        return session.execute(ACK, {"ids": [item.id for item in items], "token": token, "now": now,
                                     "key_until": key_until}).rowcount
    special_ids = {item.id for item in special}
    plain = [item.id for item in items if item.id not in special_ids]
    acked = session.execute(ACK, {"ids": plain, "token": token, "now": now, "key_until": key_until}).rowcount \
        if plain else 0
    per_batch: dict[int | None, list] = {}
    for item in special:
        per_batch.setdefault(item.batch_id, []).append(item)
    finished = []
    for batch_id in sorted(per_batch, key=lambda b: -1 if b is None else b):  # batch locks in id order
        group = per_batch[batch_id]
        ids = [item.id for item in group]
        count = session.execute(ACK, {"ids": ids, "token": token, "now": now, "key_until": key_until}).rowcount
        acked += count
        if count != len(group):
            ours = set(session.scalars(select(J.c.id).where(J.c.id.in_(ids), J.c.status == DONE,
                                                            J.c.finished_at == now)))
            group = [item for item in group if item.id in ours]
        finished += group
    batches.on_done(session, finished, values, now, keep)
    return acked


# The writes of the outcomes (outbox/engine/outcomes.py, LeaseStore): ack, reschedule, give_up, release,
# extend. Each is guarded by the claim token: 0 rows means the lease was lost, and the caller rolls back.

def reschedule(session: Session, item, next_at: datetime, error: str | None, refund_attempt: bool) -> bool:
    values = {"status": READY, "available_at": next_at, "claim_token": None}
    if error is not None:
        values["last_error"] = error[:ERROR_MAX]
    if refund_attempt:
        values["attempts"] = J.c.attempts - 1
    return session.execute(update(J).where(_held([item.id], item.claim_token)).values(values)).rowcount == 1


def give_up(session: Session, item, error: str, traceback: str | None, now: datetime, *,
            refund_attempt: bool = False, key_ttl: float = IDEMPOTENCY_TTL_DEFAULT) -> bool:
    """Failed, with the error's class apart so the failed list can be read at a glance.
    refund_attempt: given up without running (its tries were used up before this claim), so the
    attempt the claim counted is given back: the row keeps the attempts that ran."""
    error_class = error.split(":", 1)[0] if ":" in error else None
    values = {"status": FAILED, "available_at": None, "claim_token": None, "unique_key": None, "finished_at": now,
              "last_error": error[:ERROR_MAX], "error_class": (error_class or "")[:NAME_MAX] or None, "traceback": traceback}
    if refund_attempt:
        values["attempts"] = J.c.attempts - 1
    values["idempotency_until"] = _key_until(now + timedelta(seconds=key_ttl))
    if session.execute(update(J).where(_held([item.id], item.claim_token)).values(values)).rowcount != 1:
        return False
    if getattr(item, "batch_id", None) is not None or getattr(item, "flow", None) is not None:
        batches.on_failed(session, item, error, now)  # issue 39: its batch or chain, in this transaction
    return True


DUPLICATE_CLASS = "DuplicateJob"


def fail_duplicate(session: Session, job_id: int, other_id: int, now: datetime, why: str, *,
                   key_ttl: float = IDEMPOTENCY_TTL_DEFAULT, values: dict | None = None,
                   unique_key: str | None = None, guard: list | None = None) -> bool:
    """Job `job_id`, ready and in no batch or chain, failed without running (error class DuplicateJob):
    job `other_id` is the same job with the same payload and waits or runs, so it would have been refused
    at dispatch had their unique keys matched (cronbox.storage.payload_maintenance: a default key re-keyed
    by `storage seal-payloads` or `rewrap`). Failed, not deleted: `queue failed` lists it with `why`, and
    `queue retry` runs it after all. Guarded by status ready (a claim meanwhile: left to run) and
    `unique_key` as read (None: not checked), and `guard`'s conditions; `values`: more columns of the same
    UPDATE (its payload sealed). True if it was."""
    where = [J.c.id == job_id, J.c.status == READY, J.c.batch_id.is_(None), J.c.flow.is_(None), *(guard or ())]
    if unique_key is not None:
        where.append(J.c.unique_key == unique_key)
    failed = {**(values or {}), "status": FAILED, "available_at": None, "claim_token": None, "unique_key": None,
              "finished_at": now, "last_error": f"{DUPLICATE_CLASS}: {why}"[:ERROR_MAX],
              "error_class": DUPLICATE_CLASS, "traceback": None,
              "idempotency_until": _key_until(now + timedelta(seconds=key_ttl))}
    return session.execute(update(J).where(*where).values(failed)).rowcount == 1


def release(session: Session, ids: list[int], token: str, now: datetime) -> int:
    """Give back jobs claimed but not started: due again at once, attempt not counted.

    Also the refund of a group's members when a worker stops mid-group (an interrupt, the database
    gone: outbox.engine.group_commit.CommitGroup): their handlers ran, but nothing of theirs committed, so the
    claim's attempt is given back. At READ COMMITTED this UPDATE locks each row and re-reads its
    latest committed version, so the token and status guard leaves alone a job another worker has
    reclaimed (new token) or finished meanwhile."""
    if not ids:
        return 0
    return session.execute(
        update(J).where(_held(ids, token))
        .values(status=READY, available_at=now, claim_token=None, attempts=J.c.attempts - 1)
    ).rowcount


def extend(session: Session, item, lease_until: datetime) -> bool:
    return session.execute(update(J).where(_held([item.id], item.claim_token))
                           .values(available_at=lease_until)).rowcount == 1


# ---- operator actions -------------------------------------------------------------

def retry_failed(session: Session, ids: list[int] | None, queue: str | None, now: datetime) -> tuple[int, list[int]]:
    """Failed -> ready with fresh attempts. ids=None: all (of `queue`). Returns (retried, unknown ids)."""
    query = update(J).where(J.c.status == FAILED)
    unknown: list[int] = []
    if queue is not None:
        query = query.where(J.c.queue == queue)
    if ids is not None:
        found = set(session.scalars(select(J.c.id).where(J.c.id.in_(ids), J.c.status == FAILED)))
        unknown = [i for i in ids if i not in found]
        query = query.where(J.c.id.in_(ids))
    retried = ids if ids is not None else list(session.scalars(
        select(J.c.id).where(J.c.status == FAILED, J.c.batch_id.is_not(None),
                             *([J.c.queue == queue] if queue is not None else []))))
    if retried:
        batches.reopen(session, retried)  # issue 39: their batch counts them again (outbox.queue.batches)
    count = session.execute(
        query.values(status=READY, attempts=0, available_at=now, finished_at=None, claim_token=None)
    ).rowcount
    return count, unknown


def retry_batch(session: Session, batch_id: int, now: datetime) -> int:
    """A batch's failed members (cancelled ones too) back on their queues (`queue batch ID
    --retry-failed`, the console's batch page): the batch opens again, its callbacks run again when they
    finish (outbox.queue.batches.reopen). Returns how many."""
    ids = batches.failed_members(session, batch_id)
    return retry_failed(session, ids, None, now)[0] if ids else 0


def hasten(session: Session, handlers, until: datetime, now: datetime) -> int:
    """Make due now the ready jobs of `handlers` waiting until at most `until`: those a channel pause
    held back (a lifted pause's jobs). Only jobs claimed before (reserved_at set) move: one dispatched
    with a delay has never run and keeps its time. Returns how many moved."""
    if not handlers:
        return 0
    return session.execute(
        update(J).where(J.c.queue.in_({h.queue for h in handlers}), J.c.status == READY,
                        J.c.available_at > now, J.c.available_at <= until,
                        J.c.handler.in_([h.name for h in handlers]), J.c.reserved_at.is_not(None))
        .values(available_at=now)
    ).rowcount


def forget(session: Session, ids: list[int]) -> tuple[int, list[int]]:
    found = set(session.scalars(select(J.c.id).where(J.c.id.in_(ids), J.c.status == FAILED)))
    session.execute(delete(J).where(J.c.id.in_(found)))
    return len(found), [i for i in ids if i not in found]


def delete_finished(session: Session, status: str, before: datetime | None, batch: int) -> int:
    """Delete up to `batch` jobs in `status` (done or failed) finished before `before` (None: any time)."""
    query = select(J.c.id).where(J.c.status == status)
    if before is not None:
        query = query.where(J.c.finished_at < before)
    ids = list(session.scalars(query.order_by(J.c.status, J.c.finished_at).limit(batch)))
    if ids:
        session.execute(delete(J).where(J.c.id.in_(ids)))
    return len(ids)


# Failed jobs, most recently failed first; served by the (status, finished_at) index (InnoDB and
# SQLite append the id).
FAILED_ORDER = (J.c.finished_at, J.c.id)
FAILED_INDEX = "ix_cronbox_jobs_status_finished_at"
FAILED_KEY = (datetime, int)  # the page cursor's value types


def failed_page(session: Session, cursor: tuple | None = None, *, queue: str | None = None,
                size: int = paging.PAGE_SIZE) -> paging.Page:
    """One page of failed jobs with their error and trace id (ids for retry / forget), never payloads."""
    rows = select(J.c.id, J.c.queue, J.c.handler, J.c.attempts, J.c.error_class, J.c.last_error, J.c.trace_id,
                  J.c.finished_at).where(J.c.status == FAILED)
    if queue is not None:
        rows = rows.where(J.c.queue == queue)
    return paging.page(session, rows, FAILED_ORDER, cursor, size=size, index=FAILED_INDEX)


@dataclass
class QueueStatus:
    queue: str
    ready: int = 0
    delayed: int = 0
    reserved: int = 0
    failed: int = 0
    oldest_ready_at: datetime | None = None


def status(session: Session, now: datetime) -> dict[str, QueueStatus]:
    """Per queue: ready (due now, including expired leases), delayed, reserved (leased), failed.

    The queues are listed first (a loose scan of the (queue, status, ...) index), so
    each count is a range of (queue, status) pairs read from the index alone; done
    jobs, often most of the table, are never read, and failed ones (which can pile
    up) are only counted."""
    queues = list(session.scalars(select(J.c.queue).distinct()))
    if not queues:
        return {}
    due = J.c.available_at <= now
    out = {q: QueueStatus(q) for q in queues}
    live = session.execute(
        select(
            J.c.queue,
            func.sum(case((due, 1), else_=0)),
            func.sum(case((and_(J.c.status == READY, J.c.available_at > now), 1), else_=0)),
            func.sum(case((and_(J.c.status == RESERVED, J.c.available_at > now), 1), else_=0)),
            func.min(case((due, J.c.available_at), else_=None)),
        )
        .where(J.c.queue.in_(queues), J.c.status.in_((READY, RESERVED)))
        .group_by(J.c.queue)
    ).all()
    for q, ready, delayed, reserved, oldest in live:
        out[q].ready, out[q].delayed, out[q].reserved, out[q].oldest_ready_at = (
            int(ready or 0), int(delayed or 0), int(reserved or 0), oldest)
    failed = session.execute(select(J.c.queue, func.count()).where(J.c.queue.in_(queues), J.c.status == FAILED)
                             .group_by(J.c.queue)).all()
    for q, count in failed:
        out[q].failed = int(count)
    return {q: st for q, st in out.items() if st.ready or st.delayed or st.reserved or st.failed}


def waiting_per_group(session: Session, handler_groups: dict[str, str]) -> dict[str, int]:
    """Ready jobs (due or deferred) per concurrency group: a dispatch's own group, else its handler's
    (`handler_groups`, handler name -> group). Reads the ready jobs only (one range of the
    (status, finished_at) index), never the done ones."""
    own = J.c.concurrency_group
    if handler_groups:
        own = func.coalesce(J.c.concurrency_group, case(handler_groups, value=J.c.handler, else_=None))
    rows = session.execute(select(own, func.count()).where(J.c.status == READY, own.is_not(None))
                           .group_by(own)).all()
    return {group: int(count) for group, count in rows}


def backlog(session: Session, now: datetime) -> int:
    return session.scalar(select(backlog_count(now))) or 0


def backlog_count(now: datetime):
    """backlog() as an SQL expression (the tick adds it to the relay's in one statement)."""
    return select(func.count()).select_from(J).where(J.c.available_at <= now).scalar_subquery()


def overview(session: Session, queues: list[str], now: datetime) -> list[QueueStatus]:
    """`queues` (a runtime's default ones, in priority order) then any other queue with jobs."""
    per_queue = status(session, now)
    return [per_queue.get(n) or QueueStatus(n) for n in dict.fromkeys(queues + sorted(per_queue))]


# ---- what a test looks at (cronbox.testing) ------------------------------------------

def listed(session: Session, *, handler: str | None = None, queue: str | None = None) -> list:
    """Every job (of `handler`, on `queue`), in dispatch order, with its payload and outcome: the read
    model of cronbox.testing's `dispatched()`. A test database holds few rows; a deployment's is never
    read this way (the operator's views page: failed_page, status)."""
    rows = select(J.c.id, J.c.queue, J.c.handler, J.c.payload, J.c.status, J.c.attempts, J.c.available_at,
                  J.c.retry_until, J.c.last_error, J.c.error_class, J.c.created_at, J.c.reserved_at, J.c.finished_at,
                  J.c.seal_id)
    if handler is not None:
        rows = rows.where(J.c.handler == handler)
    if queue is not None:
        rows = rows.where(J.c.queue == queue)
    return list(session.execute(rows.order_by(J.c.id)).all())


def next_due(session: Session, registry: Jobs, queues: list[str], until: datetime) -> datetime | None:
    """When the next job a worker of `queues` would claim becomes due, if at or before `until`: a ready
    job's due time or a reserved one's lease end (the claim's own condition, jobs of handlers registered
    here). cronbox.testing's `drain(until=)` moves its clock there."""
    handlers = [h.name for h in registry.all() if h.queue in queues]
    if not handlers:
        return None
    return session.scalar(select(func.min(J.c.available_at)).where(
        J.c.queue.in_(queues), J.c.status.in_((READY, RESERVED)), J.c.handler.in_(handlers),
        J.c.available_at <= until))


def unregistered_due(session: Session, registry: Jobs, queues: list[str] | None, now: datetime) -> list[tuple]:
    """(queue, handler, count) of due jobs (of `queues`, None: any) whose handler is not registered
    here: a worker passes over them, so they wait (as deliveries.unregistered_due's)."""
    query = (select(J.c.queue, J.c.handler, func.count())
             .where(J.c.status.in_((READY, RESERVED)), J.c.available_at <= now)
             .group_by(J.c.queue, J.c.handler).order_by(J.c.queue, J.c.handler))
    if queues is not None:
        query = query.where(J.c.queue.in_(queues))
    names = registry.names()
    if names:
        query = query.where(J.c.handler.not_in(names))
    return [(queue, handler, int(count)) for queue, handler, count in session.execute(query).all()]


def never_claimed_due(session: Session, handlers: list[str], now: datetime) -> int:
    """Ready jobs of `handlers` due now that no worker ever claimed (no attempt counted, never reserved):
    what cronbox.testing's inline mode should have run at the commit that dispatched them."""
    if not handlers:
        return 0
    return session.scalar(select(func.count()).select_from(J).where(
        J.c.status == READY, J.c.handler.in_(handlers), J.c.attempts == 0, J.c.reserved_at.is_(None),
        J.c.available_at <= now)) or 0
