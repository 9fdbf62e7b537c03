"""Every statement that moves outbox deliveries between states, in one place.

States: pending (new, retrying, or leased when claim_token is set) -> done |
dead | skipped. Acks, retries and releases are guarded by
`WHERE id = ? AND claim_token = ?`: a rowcount of 0 means our lease expired and
someone else may hold the row, so the caller rolls back instead of applying twice.

Ordering: a pending or dead delivery holds back the later deliveries (by event
id) of the same key for the same consumer. Keyless deliveries never wait.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import Integer, and_, bindparam, case, delete, exists, func, or_, select, update
from sqlalchemy.orm import Session, aliased

from cronbox.outbox.core import paging
from cronbox.outbox.core.sql import insert_ignore
from cronbox.outbox.core.text import ERROR_MAX
from cronbox.outbox.engine.claim import claim
from cronbox.outbox.engine.registry import Consumers
from cronbox.outbox.events.placement import runs_in_tick
from cronbox.outbox.events.models import DEAD, DONE, HOLDING, PENDING, SKIPPED, Delivery, OutboxEvent

D = Delivery.__table__
E = OutboxEvent.__table__


def _event_ids(ids: list[int]):
    """A batch's event ids (integers the database gave) for `IN`, written into the statement as
    literals: hundreds of bound parameters, each escaped by the driver, cost more than its own work."""
    return bindparam("event_ids", ids, expanding=True, literal_execute=True)


class Claimed(NamedTuple):
    """A leased delivery with its event. A named tuple: a batch makes hundreds, and a frozen
    dataclass's __init__ (one object.__setattr__ per field) costs more than the tuple's."""
    id: int
    consumer: str
    attempts: int
    claim_token: str
    lease_until: datetime
    event_id: int
    event_type: str
    key: str | None
    payload: str
    trace_id: str
    created_at: datetime
    seal_id: str | None = None  # the event's, when its payload is sealed (outbox.core.sealing)


def fan_out(session: Session, registry: Consumers, now: datetime, limit: int) -> tuple[int, int]:
    """Make delivery rows for events not yet fanned out, oldest first: one pending row per
    consumer registered now, in this process, that runs in the tick (forward targets included:
    their rows are claimed and acked like every other consumer's), with the event's payload size
    (what the claim's byte bound counts).

    Delivery rows are inserted with INSERT IGNORE on (event_id, consumer), so two relays fanning
    out the same event (plain reads, no claim) cannot make duplicates; the UPDATE that marks the
    events fanned out is guarded by `fanned_out_at IS NULL`, so either relay's mark is as good.
    Returns (events, deliveries).
    """
    events = session.execute(
        select(E.c.id, E.c.type, E.c.key, E.c.available_at, E.c.payload_bytes)
        .where(E.c.fanned_out_at.is_(None)).order_by(E.c.id).limit(limit)
    ).all()
    if not events:
        return 0, 0
    consumers_of: dict[str, list] = {}  # a batch holds few types: each matched against the patterns once
    rows = []
    for event in events:
        consumers = consumers_of.get(event.type)
        if consumers is None:
            consumers = consumers_of[event.type] = [c for c in registry.for_type(event.type) if runs_in_tick(c)]
        rows += [{"event_id": event.id, "consumer": consumer.name, "key": event.key, "status": PENDING,
                  "attempts": 0, "next_attempt_at": event.available_at, "created_at": now,
                  "payload_bytes": event.payload_bytes}
                 for consumer in consumers]
    if rows:
        insert_ignore(session, D, rows)
    session.execute(
        update(E).where(E.c.id.in_(_event_ids([e.id for e in events])), E.c.fanned_out_at.is_(None))
        .values(fanned_out_at=now)
    )
    return len(events), len(rows)


def lease_for(consumers, now: datetime, lease_margin: float) -> dict[str, datetime]:
    """When a lease taken now ends, per consumer: its timeout plus the margin (as _claim sets it)."""
    return {c.name: now + timedelta(seconds=c.timeout + lease_margin) for c in consumers}


def claim_due(session: Session, registry: Consumers, *, now: datetime, limit: int, mode: str,
              lease_margin: float) -> list[Claimed]:
    """Claim due deliveries for consumers registered here (in-process consumers and forward
    targets alike); counts the attempt.

    A delivery whose lease expired is claimed alone, before any fresh work: its run
    died, perhaps because of it (a consumer that gets the process killed). Claimed
    in a batch, it would count an attempt against every batch-mate each time it
    kills the process again; alone, only the item being handled pays.
    """
    consumers = registry.all()
    if not consumers or limit <= 0:
        return []
    for (claimable, candidates), size in ((EXPIRED, 1), (FRESH, limit)):
        claimed = _claim(session, consumers, claimable, candidates, size, now=now, mode=mode, lease_margin=lease_margin)
        if claimed:
            return claimed
    return []


# The claim's statements, built once (outbox.engine.claim's `params`: twice a batch, building them cost
# more Python than the batch's items), their values bound at each claim.
# A delivery waits while an earlier one of its key, for its consumer, is pending or dead.
_EARLIER = D.alias()
HELD_BACK = exists().where(_EARLIER.c.consumer == D.c.consumer, _EARLIER.c.key == D.c.key,
                           _EARLIER.c.status.in_(HOLDING), _EARLIER.c.event_id < D.c.event_id)


def _claimable(claimable):
    """(`claimable`, the candidates it picks): ids and payload sizes (the claim takes up to its bytes:
    outbox.engine.claim), in id order."""
    return claimable, (
        select(D.c.id, D.c.payload_bytes)
        .where(claimable, D.c.consumer.in_(bindparam("claim_consumers", expanding=True)),
               or_(D.c.key.is_(None), ~HELD_BACK))
        .order_by(D.c.id)
        .limit(bindparam("claim_limit", type_=Integer))
    )


EXPIRED = _claimable(and_(D.c.status == PENDING, D.c.claim_token.is_not(None), D.c.lease_until < bindparam("claim_now")))
FRESH = _claimable(and_(D.c.status == PENDING, D.c.claim_token.is_(None), D.c.next_attempt_at <= bindparam("claim_now")))

# A Claimed's columns, in its fields' order.
CLAIMED = (D.c.id, D.c.consumer, D.c.attempts, D.c.claim_token, D.c.lease_until, E.c.id.label("event_id"), E.c.type,
           E.c.key, E.c.payload, E.c.trace_id, E.c.created_at, E.c.seal_id)


def _claim(session: Session, consumers, claimable, candidates, limit: int, *, now: datetime, mode: str,
           lease_margin: float) -> list[Claimed]:
    params = {"claim_now": now, "claim_consumers": [c.name for c in consumers], "claim_limit": limit}
    token = uuid.uuid4().hex
    leases = lease_for(consumers, now, lease_margin)
    values = {
        "claim_token": token,
        "attempts": D.c.attempts + 1,
        "lease_until": case(leases, value=D.c.consumer, else_=max(leases.values())),
    }
    ids = claim(session, D, candidates, claimable, values, mode=mode, direct_lock=False, params=params)
    if not ids:
        return []
    rows = session.execute(
        select(*CLAIMED).join(E, E.c.id == D.c.event_id).where(D.c.id.in_(ids)).order_by(D.c.id)
    ).all()
    return [Claimed(*row) for row in rows]  # by position: a Row's attributes are looked up by name


# Built once: the ack runs once a delivery (a handler's writes commit with it), and building an
# UPDATE of five values and three conditions costs more Python than sending it. Bound parameters
# take the columns' types (claim_token's exact bytes on MySQL), as in any statement.
ACK = (update(D).where(D.c.id.in_(bindparam("ids", expanding=True)), D.c.claim_token == bindparam("token"),
                       D.c.status == PENDING)
       .values(status=DONE, claim_token=None, lease_until=None, finished_at=bindparam("now"), last_error=None))


def ack(session: Session, items: list, token: str, now: datetime, values: dict | None = None) -> int:
    """Mark leased deliveries (`items` of one claim `token`) done, without the error of an earlier
    attempt (a done delivery shows none); returns how many were still ours. (`values`: a consumer's
    return value is not kept: always None.)"""
    if not items:
        return 0
    return session.execute(ACK, {"ids": [item.id for item in items], "token": token, "now": now}).rowcount


# The writes of the outcomes (outbox/engine/outcomes.py, LeaseStore): ack, reschedule, give_up, release,
# extend. Each is guarded by the claim token: 0 rows means the lease was lost, and the caller rolls back.

def reschedule(session: Session, item, next_at: datetime, error: str | None, refund_attempt: bool) -> bool:
    """Back to pending for a later attempt (refund_attempt: RetryLater, which uses no attempt)."""
    values = {"claim_token": None, "lease_until": None, "next_attempt_at": next_at}
    if error is not None:
        values["last_error"] = error[:ERROR_MAX]
    if refund_attempt:
        values["attempts"] = D.c.attempts - 1
    result = session.execute(
        update(D).where(D.c.id == item.id, D.c.claim_token == item.claim_token, D.c.status == PENDING).values(values)
    )
    return result.rowcount == 1


def extend(session: Session, item, lease_until: datetime) -> bool:
    result = session.execute(
        update(D).where(D.c.id == item.id, D.c.claim_token == item.claim_token, D.c.status == PENDING)
        .values(lease_until=lease_until)
    )
    return result.rowcount == 1


def give_up(session: Session, item, error: str, traceback: str | None, now: datetime, *,
            refund_attempt: bool = False) -> bool:
    """Dead: it holds its key for this consumer until `outbox retry` or `outbox skip`.
    refund_attempt: given up without running (its attempts were used up before this claim), so the
    attempt the claim counted is given back: the row keeps the attempts that ran."""
    values = {"status": DEAD, "claim_token": None, "lease_until": None, "last_error": error[:ERROR_MAX],
              "finished_at": now}
    if refund_attempt:
        values["attempts"] = D.c.attempts - 1
    result = session.execute(
        update(D).where(D.c.id == item.id, D.c.claim_token == item.claim_token, D.c.status == PENDING).values(values)
    )
    return result.rowcount == 1


def release(session: Session, ids: list[int], token: str, now: datetime) -> int:
    """Give back leases on deliveries claimed but not started; their attempt is not counted.

    Also the refund of a group's members when a run stops mid-group (an interrupt, the database
    gone: outbox.engine.group_commit.CommitGroup): their handlers ran, but nothing of theirs committed, so the
    claim's attempt is given back. (A group lost while the run goes on needs no write: its members
    run again at once under the same claim, whose one counted attempt is theirs.) At READ COMMITTED
    this UPDATE locks each row and re-reads its latest committed version, so the token and status
    guard leaves alone a delivery another run has reclaimed (new token) or finished meanwhile."""
    if not ids:
        return 0
    result = session.execute(
        update(D).where(D.c.id.in_(ids), D.c.claim_token == token, D.c.status == PENDING)
        .values(claim_token=None, lease_until=None, attempts=D.c.attempts - 1)
    )
    return result.rowcount


# ---- operator actions -------------------------------------------------------------

def retry(session: Session, ids: list[int] | None, now: datetime) -> tuple[int, list[int]]:
    """Dead -> pending with fresh attempts. ids=None: all dead. Returns (revived, unknown ids)."""
    query = update(D).where(D.c.status == DEAD)
    unknown: list[int] = []
    if ids is not None:
        unknown = _missing(session, ids, D.c.status == DEAD)
        query = query.where(D.c.id.in_(ids))
    result = session.execute(
        query.values(status=PENDING, attempts=0, next_attempt_at=now, claim_token=None, lease_until=None,
                     finished_at=None)
    )
    return result.rowcount, unknown


def skip(session: Session, ids: list[int] | None, now: datetime, *, upto: int | None = None
         ) -> tuple[int, list[int]]:
    """Give up on dead or waiting deliveries (not ones leased right now), releasing their key.
    ids=None: every dead delivery (never all waiting ones: that would silently drop live work), or
    every dead one with an id up to `upto` (those the operator saw when confirming)."""
    if ids is None:
        query, unknown = update(D).where(D.c.status == DEAD), []
        if upto is not None:
            query = query.where(D.c.id <= upto)
    else:
        skippable = or_(D.c.status == DEAD,
                        and_(D.c.status == PENDING, or_(D.c.claim_token.is_(None), D.c.lease_until < now)))
        query, unknown = update(D).where(D.c.id.in_(ids), skippable), _missing(session, ids, skippable)
    result = session.execute(query.values(status=SKIPPED, claim_token=None, lease_until=None, finished_at=now))
    return result.rowcount, unknown


def _missing(session: Session, ids: list[int], condition) -> list[int]:
    found = set(session.scalars(select(D.c.id).where(D.c.id.in_(ids), condition)))
    return [i for i in ids if i not in found]


def last_dead_id(session: Session) -> int | None:
    return session.scalar(select(func.max(D.c.id)).where(D.c.status == DEAD))


# Dead deliveries, newest attempt first; served by the (status, next_attempt_at, id) index.
DEAD_ORDER = (D.c.next_attempt_at, D.c.id)
DEAD_INDEX = "ix_cronbox_deliveries_status_next_attempt_at_id"
DEAD_KEY = (datetime, int)  # the page cursor's value types


def dead_page(session: Session, cursor: tuple | None = None, *, size: int = paging.PAGE_SIZE) -> paging.Page:
    """One page of dead deliveries with their event (ids for `outbox retry` / `outbox skip`)."""
    rows = (select(D.c.id, D.c.consumer, D.c.key, D.c.attempts, D.c.last_error, D.c.next_attempt_at,
                   D.c.finished_at, E.c.id.label("event_id"), E.c.type, E.c.trace_id)
            .join(E, E.c.id == D.c.event_id).where(D.c.status == DEAD))
    return paging.page(session, rows, DEAD_ORDER, cursor, size=size, index=DEAD_INDEX)


@dataclass(frozen=True)
class Failing:
    """A consumer's pending deliveries that have failed at least once (health's `forward.*` checks)."""
    consumer: str
    count: int
    since: datetime  # the oldest one's row was made then: nothing of the consumer went through since
    last_error: str | None  # the newest one's


def failing(session: Session, consumers: list[str]) -> list[Failing]:
    """Per consumer of `consumers` with pending deliveries that failed (a last_error): how many, since
    when (the oldest's created_at), and the newest error. Two statements, only for failing consumers."""
    if not consumers:
        return []
    rows = session.execute(
        select(D.c.consumer, func.count(), func.min(D.c.created_at))
        .where(D.c.status == PENDING, D.c.consumer.in_(consumers), D.c.last_error.is_not(None))
        .group_by(D.c.consumer)).all()
    out = []
    for name, count, since in rows:
        error = session.scalar(select(D.c.last_error).where(D.c.status == PENDING, D.c.consumer == name,
                                                            D.c.last_error.is_not(None))
                               .order_by(D.c.id.desc()).limit(1))
        out.append(Failing(name, int(count), since, error))
    return out


@dataclass
class ConsumerStatus:
    consumer: str
    pending: int = 0
    due: int = 0
    dead: int = 0
    blocked_keys: int = 0
    oldest_due_at: datetime | None = None


def status(session: Session, now: datetime) -> dict[str, ConsumerStatus]:
    """Per consumer: pending (waiting, retrying or leased), due now, dead, keys held back.

    One status at a time, so each statement is a range of the (status, consumer,
    next_attempt_at) index read without touching the table: the console and the
    health check stay fast with 100k dead deliveries, and delivered rows (kept a
    week) are never read at all."""
    out: dict[str, ConsumerStatus] = {}
    pending = session.execute(
        select(D.c.consumer, func.count(),
               func.sum(case((D.c.next_attempt_at <= now, 1), else_=0)), func.min(D.c.next_attempt_at))
        .where(D.c.status == PENDING).group_by(D.c.consumer)
    ).all()
    for name, count, due, oldest in pending:
        out[name] = ConsumerStatus(name, int(count), int(due or 0),
                                   oldest_due_at=oldest if oldest is not None and oldest <= now else None)
    for name, count in session.execute(select(D.c.consumer, func.count()).where(D.c.status == DEAD)
                                       .group_by(D.c.consumer)).all():
        out.setdefault(name, ConsumerStatus(name)).dead = int(count)
    for name, count in session.execute(_blocked_keys_per_consumer()).all():
        out.setdefault(name, ConsumerStatus(name)).blocked_keys = int(count)
    return out


def _holding_a_key(row=D.c):
    """A keyed delivery that is dead, or has failed before and waits to retry: it holds its key."""
    return and_(row.key.is_not(None),
                or_(row.status == DEAD, and_(row.status == PENDING, row.attempts > 0, row.claim_token.is_(None))))


def _blocked_keys_per_consumer():
    """Keys with a pending delivery waiting behind a holder. Read from the pending side: the waiting
    rows are the live backlog, while dead holders can be many and mostly block nothing."""
    waiting = (select(D.c.consumer, D.c.key)
               .where(D.c.status == PENDING, D.c.key.is_not(None), exists().where(*_earlier_holder(aliased(Delivery))))
               .distinct().subquery())
    return select(waiting.c.consumer, func.count()).group_by(waiting.c.consumer)


def blocked_keys(session: Session, limit: int = 50):
    """(consumer, key, holding delivery id, its status, deliveries waiting behind it), holders by id.

    Two steps, both driven from the waiting (pending) side: which keys are blocked,
    then their holders. One join would leave the join order to the planner, and
    SQLite without statistics starts from the holders, all the dead rows."""
    blocked = session.execute(
        select(D.c.consumer, D.c.key)
        .where(D.c.status == PENDING, D.c.key.is_not(None), exists().where(*_earlier_holder(aliased(Delivery))))
        .distinct().limit(limit)
    ).all()
    if not blocked:
        return []
    holder = aliased(Delivery)
    waiting = (select(func.count()).where(D.c.consumer == holder.consumer, D.c.key == holder.key,
                                          D.c.status == PENDING, D.c.event_id > holder.event_id)
               .correlate(holder).scalar_subquery())
    return session.execute(
        select(holder.consumer, holder.key, holder.id, holder.status, waiting.label("waiting"))
        .where(or_(*[and_(holder.consumer == consumer, holder.key == key) for consumer, key in blocked]),
               _holding_a_key(holder), waiting > 0)
        .order_by(holder.id)
        .limit(limit)
    ).all()


def _earlier_holder(holder):
    """Conditions for `holder` holding the key of the (outer) delivery D, ahead of it."""
    return (holder.consumer == D.c.consumer, holder.key == D.c.key, holder.event_id < D.c.event_id,
            _holding_a_key(holder))


def unfanned_count(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(E).where(E.c.fanned_out_at.is_(None))) or 0


def backlog(session: Session, now: datetime) -> int:
    """Work a relay could do right now: events not yet fanned out plus due pending deliveries."""
    return session.scalar(select(backlog_count(now))) or 0


def backlog_count(now: datetime):
    """backlog() as one SQL expression, two counts in one statement (the tick adds the jobs' to it)."""
    due = select(func.count()).select_from(D).where(D.c.status == PENDING, D.c.next_attempt_at <= now)
    unfanned = select(func.count()).select_from(E).where(E.c.fanned_out_at.is_(None))
    return due.scalar_subquery() + unfanned.scalar_subquery()


def unregistered_due(session: Session, registry: Consumers, now: datetime) -> list[tuple[str, int]]:
    """Due deliveries whose consumer is not registered in this process (they wait, never die)."""
    query = (
        select(D.c.consumer, func.count())
        .where(D.c.status == PENDING, D.c.next_attempt_at <= now)
        .group_by(D.c.consumer)
    )
    names = registry.names()
    if names:
        query = query.where(D.c.consumer.not_in(names))
    return [(name, int(count)) for name, count in session.execute(query).all()]


def prune(session: Session, cutoff: datetime, batch: int) -> int:
    """Delete up to `batch` events fanned out before `cutoff` whose deliveries are all finished
    (done or skipped), with those deliveries. Events with dead or pending deliveries stay."""
    unfinished = exists().where(D.c.event_id == E.c.id, D.c.status.in_(HOLDING))
    ids = list(session.scalars(
        select(E.c.id).where(E.c.fanned_out_at.is_not(None), E.c.fanned_out_at < cutoff, ~unfinished)
        .order_by(E.c.id).limit(batch)
    ))
    if not ids:
        return 0
    session.execute(delete(D).where(D.c.event_id.in_(ids), D.c.status.in_((DONE, SKIPPED))))
    session.execute(delete(E).where(E.c.id.in_(ids)))
    return len(ids)


@dataclass
class Overview:
    """What `outbox status` and the console's outbox page show."""
    consumers: list[tuple[str, bool, ConsumerStatus]]  # (name, registered here, counts), by name
    unfanned: int
    blocked: list


def overview(session: Session, registry: Consumers, now: datetime) -> Overview:
    per_consumer = status(session, now)
    registered = set(registry.names())
    names = sorted(set(per_consumer) | registered)
    return Overview([(n, n in registered, per_consumer.get(n) or ConsumerStatus(n)) for n in names],
                    unfanned_count(session), blocked_keys(session))


# ---- what a test looks at (cronbox.testing) ------------------------------------------

def recorded(session: Session, *, type: str | None = None) -> list[tuple]:
    """Every event (of `type`), in id order, each with its delivery rows (by id): the read model of
    cronbox.testing's `recorded()`. Two statements; a test database holds few rows (the operator's
    views page instead: dead_page, status)."""
    query = select(E.c.id, E.c.type, E.c.key, E.c.payload, E.c.created_at, E.c.available_at, E.c.fanned_out_at,
                   E.c.seal_id)
    if type is not None:
        query = query.where(E.c.type == type)
    events = session.execute(query.order_by(E.c.id)).all()
    if not events:
        return []
    rows: dict[int, list] = {event.id: [] for event in events}
    for delivery in session.execute(
            select(D.c.id, D.c.event_id, D.c.consumer, D.c.status, D.c.attempts, D.c.next_attempt_at,
                   D.c.last_error, D.c.finished_at)
            .where(D.c.event_id.in_(_event_ids(list(rows)))).order_by(D.c.id)).all():
        rows[delivery.event_id].append(delivery)
    return [(event, rows[event.id]) for event in events]
