"""Every statement that moves jobs between states, in one place.

ready --claim--> reserved --ack--> done
                          --retry--> ready (later) --...--> failed (tries used up / permanent)
`available_at` is the due time of a ready job and the lease expiry of a reserved
one (NULL once finished); the claim reads one index range (queue, status,
available_at <= now). A reserved job whose lease ran out is due again, alone. Every change after the claim is
guarded by `claim_token`: rowcount 0 means the lease was lost.
A queue forwarded to the broker (outbox.queue.forward_jobs) has the same states: the publisher's
claim reserves its jobs under a publish token, and a broker worker takes them (a token of its own, the
attempt counted) by the id and token their messages carry.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, bindparam, case, delete, exists, func, select, update
from sqlalchemy.orm import Session

from cronbox.outbox.core import paging
from cronbox.outbox.core.text import ERROR_MAX
from cronbox.outbox.engine.claim import CLAIM_BYTES, SKIP_LOCKED, claim, within_bytes
from cronbox.outbox.engine.registry import Jobs
from cronbox.outbox.queue.models import DONE, FAILED, READY, RESERVED, Job

J = Job.__table__


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
    for status, size in ((RESERVED, 1), (READY, limit)):
        claimed = _claim(session, handlers, queue, status, size, now=now, mode=mode, lease_margin=lease_margin)
        if claimed:
            return claimed
    return []


def _claim(session: Session, handlers, queue: str, status: str, limit: int, *, now: datetime, mode: str,
           lease_margin: float) -> list[ClaimedJob]:
    claimable = and_(J.c.queue == queue, J.c.status == status, J.c.available_at <= now)
    candidates = (
        select(J.c.id, J.c.payload_bytes)  # the claim takes up to its bytes (outbox.engine.claim)
        .where(claimable, J.c.handler.in_([h.name for h in handlers]))
        .order_by(J.c.available_at, J.c.id)
        .limit(limit)
    )
    token = uuid.uuid4().hex
    leases = {h.name: now + timedelta(seconds=h.timeout + lease_margin) for h in handlers}
    values = {
        "claim_token": token,
        "status": RESERVED,
        "attempts": J.c.attempts + 1,
        "available_at": case(leases, value=J.c.handler, else_=max(leases.values())),
        "reserved_at": now,
    }
    ids = claim(session, J, candidates, claimable, values, mode=mode)
    if not ids:
        return []
    return _rows(session, J.c.id.in_(ids), ids)


# ---- jobs served by the broker (outbox.queue.forward_jobs) ------------------------
# The publisher's claim and the broker worker's take. Same states: a job on the broker is `reserved`
# under the publisher's claim token, its message carries id and token; a broker worker takes it by
# both, in a short transaction of its own that gives it a token of its own (only one copy of a
# message can), and every later write is guarded by that one.

def claim_to_publish(session: Session, registry: Jobs, queue: str, *, now: datetime, limit: int, mode: str,
                     lease_until: datetime) -> tuple[list[ClaimedJob], list[ClaimedJob], set[int]]:
    """The jobs of a forwarded queue to publish now: (claimed, again, the ids of `again` a worker had taken).

    claimed: due ready jobs, reserved with a new claim token (`reserved_at` cleared: not taken yet).
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
        retaken = case((J.c.reserved_at.is_(None), J.c.claim_token), else_=uuid.uuid4().hex)
        session.execute(update(J).where(J.c.id.in_(ids), expired).values(
            claim_token=retaken, reserved_at=None, available_at=lease_until))
        # What this UPDATE changed, read back by the exact lease it wrote (microseconds on every backend):
        # in token mode (no row locks on the read) a row a worker took meanwhile is not ours to send.
        again = _rows(session, and_(J.c.id.in_(ids), J.c.status == RESERVED, J.c.available_at == lease_until), ids)
    values = {"claim_token": uuid.uuid4().hex, "status": RESERVED, "available_at": lease_until, "reserved_at": None}
    claimable = and_(J.c.queue == queue, J.c.status == READY, J.c.available_at <= now)
    fresh = (select(J.c.id, J.c.payload_bytes).where(claimable, J.c.handler.in_(names))
             .order_by(J.c.available_at, J.c.id).limit(limit - len(again)))
    again_ids = {item.id for item in again}
    bytes_left = CLAIM_BYTES - sum(row.payload_bytes or 0 for row in found if row.id in again_ids)
    room = len(again) < limit and len(found) == len(candidates_found) and bytes_left > 0  # not cut by bytes
    claimed_ids = claim(session, J, fresh, claimable, values, mode=mode, max_bytes=bytes_left) if room else []
    claimed = _rows(session, J.c.id.in_(claimed_ids), claimed_ids) if claimed_ids else []
    return claimed, again, taken_before & {item.id for item in again}


def published(session: Session, items: list[ClaimedJob], lease_until: datetime) -> int:
    """The broker has these (confirmed), or a failed publish is to be tried again then: their lease
    becomes `lease_until`, never shorter than it is. Guarded by each claim token: a job a worker took
    already (its message can be taken before the confirm is read) has a token of its own, and is left alone."""
    by_token: dict[str, list[int]] = {}
    for item in items:
        by_token.setdefault(item.claim_token, []).append(item.id)
    later = case((J.c.available_at > lease_until, J.c.available_at), else_=lease_until)
    return sum(session.execute(update(J).where(_held(ids, token)).values(available_at=later)).rowcount
               for token, ids in by_token.items())


def take(session: Session, registry: Jobs, named: list[tuple[int, str]], *, now: datetime,
         lease_margin: float) -> tuple[list[ClaimedJob], list[ClaimedJob]]:
    """The broker worker's claim of the jobs its messages name ((id, claim token) pairs): (taken, not_here).

    taken: the named jobs still reserved under a token a message carries, of handlers registered
    here, now reserved under one new token with this attempt counted and the handler's lease
    (timeout + lease_margin), as the database worker's claim does. The UPDATE locks each row and
    re-reads it (READ COMMITTED): of two copies of one message taken at once, the second finds the
    token changed and takes nothing; a copy that comes later is stale the same way. Only publish
    tokens are ever in a message (a job sent again after a worker took it gets a new one:
    claim_to_publish), so a job a worker holds is never matched.
    not_here: named jobs still on the broker whose handler this worker does not have (read only when
    some named job was not taken)."""
    if not named:
        return [], []
    ids = list(dict.fromkeys(job_id for job_id, _token in named))
    tokens = list(dict.fromkeys(token for _job_id, token in named))
    on_broker = and_(J.c.id.in_(ids), J.c.claim_token.in_(tokens), J.c.status == RESERVED)
    leases = {h.name: now + timedelta(seconds=h.timeout + lease_margin) for h in registry.all()}
    token = uuid.uuid4().hex
    taken: list[ClaimedJob] = []
    if leases:
        session.execute(update(J).where(on_broker, J.c.handler.in_(list(leases))).values(
            claim_token=token, attempts=J.c.attempts + 1, reserved_at=now,
            available_at=case(leases, value=J.c.handler, else_=max(leases.values()))))
        taken = _rows(session, and_(J.c.id.in_(ids), J.c.claim_token == token), ids)
    not_here: list[ClaimedJob] = []
    if len(taken) < len(ids):
        not_here = _rows(session, on_broker if not leases else and_(on_broker, J.c.handler.not_in(list(leases))), ids)
    return taken, not_here


def _rows(session: Session, where, order: list[int]) -> list[ClaimedJob]:
    rows = session.execute(
        select(J.c.id, J.c.queue, J.c.handler, J.c.payload, J.c.attempts, J.c.claim_token, J.c.available_at,
               J.c.retry_until, J.c.trace_id, J.c.concurrency_group, J.c.cost).where(where)).all()
    position = {job_id: index for index, job_id in enumerate(order)}
    return [ClaimedJob(r.id, r.queue, r.handler, r.payload, r.attempts, r.claim_token, r.available_at,
                       r.retry_until, r.trace_id, r.concurrency_group, r.cost)
            for r in sorted(rows, key=lambda r: position.get(r.id, len(position)))]


def _held(ids, token):
    return and_(J.c.id.in_(ids), J.c.claim_token == token, J.c.status == RESERVED)


# Built once, as deliveries.ACK: the ack runs once a job when its writes commit with it.
ACK = (update(J).where(_held(bindparam("ids", expanding=True), bindparam("token")))
       .values(status=DONE, available_at=None, claim_token=None, unique_key=None, finished_at=bindparam("now"),
               last_error=None, error_class=None, traceback=None))


def ack(session: Session, ids: list[int], token: str, now: datetime) -> int:
    """Done. An earlier attempt's error (a retry, or an operator's `queue retry` of a failed job) goes:
    a done job shows no error."""
    if not ids:
        return 0
    return session.execute(ACK, {"ids": ids, "token": token, "now": now}).rowcount


# The processor's writes (outbox/engine/processor.py, LeaseStore): ack, reschedule, give_up, release,
# extend. Each is guarded by the claim token: 0 rows means the lease was lost, and the caller rolls back.

def reschedule(session: Session, item, next_at: datetime, error: str | None, refund_attempt: bool) -> bool:
    values = {"status": READY, "available_at": next_at, "claim_token": None}
    if error is not None:
        values["last_error"] = error[:ERROR_MAX]
    if refund_attempt:
        values["attempts"] = J.c.attempts - 1
    return session.execute(update(J).where(_held([item.id], item.claim_token)).values(values)).rowcount == 1


def give_up(session: Session, item, error: str, traceback: str | None, now: datetime) -> bool:
    """Failed, with the error's class apart so the failed list can be read at a glance."""
    error_class = error.split(":", 1)[0] if ":" in error else None
    return session.execute(
        update(J).where(_held([item.id], item.claim_token))
        .values(status=FAILED, available_at=None, claim_token=None, unique_key=None, finished_at=now,
                last_error=error[:ERROR_MAX], error_class=(error_class or "")[:191] or None, traceback=traceback)
    ).rowcount == 1


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
    count = session.execute(
        query.values(status=READY, attempts=0, available_at=now, finished_at=None, claim_token=None)
    ).rowcount
    return count, unknown


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
