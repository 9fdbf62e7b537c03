"""Flights: a forward target's fresh keyless deliveries, published and not yet settled.

The relay's fan-out leases a forward target's new deliveries to itself so that a fresh event costs
no claim statement. Keyed ones are inserted as leased delivery rows (they must hold their key for
every relay's claim, outbox.events.deliveries). A keyless delivery holds nothing, so nothing but
the relay that publishes it needs to see it until its outcome is known: it is not written as a row
at all. One flight row per (fan-out, target) stands for them all: their event ids, the claim token
and the lease. When the broker's confirms are in, the relay "lands" the flight
(deliveries.land_flight): it deletes this row and writes each delivery's row once, done, retrying
or dead, in the same transaction. On MySQL that is one row write a delivery instead of an INSERT
of a leased row and an UPDATE of its six-index row to done (the UPDATE was the costliest statement
of forwarding).

The row is the lease, guarded like a delivery's: whoever deletes it (one DELETE, rowcount 1) owns
what it stands for. A flight whose lease ran out (the relay was killed, or stalled past it) is
"grounded" by the next claim (deliveries.ground_expired_flights): turned into exactly the leased
delivery rows it stands for (attempt 1, its token, its expired lease), which the claim then takes
one at a time like any expired lease, so a batch that kills the process still counts its attempts
and goes dead. A relay that lands a flight someone grounded finds the row gone and records
nothing (lease lost: the grounded rows are published again, with the same message ids).

This module owns the flight rows' SQL only; the delivery rows they become are written by
outbox.events.deliveries.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, case, delete, func, select, update
from sqlalchemy.orm import Session

from outbox.events.models import Flight

F = Flight.__table__


def start(session: Session, token: str, consumer: str, event_ids: list[int], lease_until: datetime,
          now: datetime) -> None:
    """The flight of `event_ids` (ascending) for `consumer`, leased until `lease_until`."""
    session.execute(F.insert().values(token=token, consumer=consumer, event_ids=",".join(map(str, event_ids)),
                                      size=len(event_ids), first_event_id=event_ids[0],
                                      last_event_id=event_ids[-1], lease_until=lease_until, created_at=now))


def take(session: Session, token: str, consumer: str, *, expired_before: datetime | None = None) -> bool:
    """Delete the flight row: True if it was still there, i.e. the lease is ours and what it stands for
    is ours to write. At READ COMMITTED the DELETE waits for a concurrent taker's (or extender's) row
    lock and then re-reads the row, so exactly one of two takers gets True. `expired_before`: only if
    its lease ended before then (a grounding claim: the owner may have extended it since)."""
    condition = [F.c.token == token, F.c.consumer == consumer]
    if expired_before is not None:
        condition.append(F.c.lease_until < expired_before)
    return session.execute(delete(F).where(*condition)).rowcount == 1


def extend(session: Session, token: str, consumer: str, lease_until: datetime) -> bool:
    return session.execute(
        update(F).where(F.c.token == token, F.c.consumer == consumer).values(lease_until=lease_until)
    ).rowcount == 1


def expired(session: Session, consumers: list[str] | None, now: datetime, limit: int) -> list:
    """(token, consumer, event ids, lease_until) of flights (of `consumers`; None: any) whose lease ran out."""
    query = select(F.c.token, F.c.consumer, F.c.event_ids, F.c.lease_until).where(F.c.lease_until < now)
    if consumers is not None:
        query = query.where(F.c.consumer.in_(consumers))
    rows = session.execute(query.order_by(F.c.lease_until).limit(limit)).all()
    return [(token, consumer, [int(i) for i in ids.split(",")], lease_until)
            for token, consumer, ids, lease_until in rows]


def sizes(session: Session, now: datetime) -> list[tuple[str, int, int, datetime | None]]:
    """(consumer, deliveries in flight, of them in flights whose lease ran out, the earliest such
    lease end) for `outbox status`, the console and health: pending work, due once expired."""
    expired = F.c.lease_until < now
    rows = session.execute(
        select(F.c.consumer, func.sum(F.c.size), func.sum(case((expired, F.c.size), else_=0)),
               func.min(case((expired, F.c.lease_until), else_=None)))
        .group_by(F.c.consumer)).all()
    return [(name, int(size), int(late or 0), oldest) for name, size, late, oldest in rows]


def covering(event_id_column):
    """A condition: some flight's event id range holds this event (prune keeps such events)."""
    return select(F.c.token).where(and_(F.c.first_event_id <= event_id_column,
                                        F.c.last_event_id >= event_id_column)).exists()
