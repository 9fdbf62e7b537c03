"""Heartbeat rows: one per run, written at start and finished at the end.

They are how health knows the tick runs, how tests count which of several
racing ticks worked, and what the operator console charts. A run killed
mid-way leaves its row with outcome "running" and no finished_at.
"""
from __future__ import annotations

import os
import socket

from sqlalchemy import delete, func, insert, or_, select, update

from cronbox.outbox.core import clock
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine.models import Heartbeat

H = Heartbeat.__table__

# A long-running run (amqp consume) beats this often; health calls it dead after STALE_BEATS missed.
BEAT_SECONDS = 10.0
STALE_BEATS = 3


def start(sessions, command: str, *, detail: str | None = None, beats: bool = False) -> int:
    """`beats`: a long-running run that will call beat() every few seconds (its beat_at starts now)."""
    def add(session):
        # A Core INSERT, as beat() and finish() write: an ORM object here was a cron process's only
        # one, and its first flush configured every mapper and the ORM's unit of work (~10 ms a start).
        now = clock.utcnow()
        row = dict(command=command, host=socket.gethostname()[:255], pid=os.getpid(),
                   started_at=now, outcome="running", delivered=0, retried=0, dead=0,
                   jobs_done=0, jobs_failed=0, beat_at=now if beats else None,
                   detail=detail[:NAME_MAX] if detail else None)
        return session.execute(insert(H).values(row)).inserted_primary_key[0]

    return in_transaction(sessions, add)


def beat(sessions, heartbeat_id: int, **counts) -> None:
    """A long-running run is alive: beat_at = now, and its counts so far."""
    values = {"beat_at": clock.utcnow(), **counts}
    in_transaction(sessions, lambda s: s.execute(update(H).where(H.c.id == heartbeat_id).values(values)))


def finish(sessions, heartbeat_id: int, *, outcome: str, error: str | None = None, **counts) -> None:
    values = {"finished_at": clock.utcnow(), "outcome": outcome[:32], **counts}
    if error:
        values["error"] = error[:1000]
    # A lock wait that timed out is not waited again: the run's end must not wait on another transaction.
    in_transaction(sessions, lambda s: s.execute(update(H).where(H.c.id == heartbeat_id).values(values)),
                   retry_waits=False)


def prune(session, cutoff, batch: int) -> int:
    """Rows of runs started before `cutoff`, except a long-running one that beat since (a consumer
    up for weeks keeps its row, or health would stop seeing it)."""
    ids = list(session.scalars(H.select().with_only_columns(H.c.id)
                               .where(H.c.started_at < cutoff, or_(H.c.beat_at.is_(None), H.c.beat_at < cutoff))
                               .order_by(H.c.id).limit(batch)))
    if ids:
        session.execute(delete(H).where(H.c.id.in_(ids)))
    return len(ids)


def recent(session, command: str, limit: int) -> list[Heartbeat]:
    """The latest runs of `command`, newest first."""
    return list(session.scalars(select(Heartbeat).where(Heartbeat.command == command)
                                .order_by(Heartbeat.started_at.desc(), Heartbeat.id.desc()).limit(limit)))


def latest_per_detail(session, command: str) -> list[Heartbeat]:
    """The latest run of `command` for each detail (e.g. each queue a consumer serves), by detail."""
    latest = (select(func.max(H.c.id)).where(H.c.command == command).group_by(H.c.detail)).scalar_subquery()
    return list(session.scalars(select(Heartbeat).where(Heartbeat.id.in_(latest)).order_by(Heartbeat.detail)))


def between(session, start, end):
    """(started_at, command, delivered, jobs_done, backlog, outcome) of every run started in [start, end):
    what the console's 24-hour chart draws."""
    return session.execute(select(H.c.started_at, H.c.command, H.c.delivered, H.c.jobs_done, H.c.backlog,
                                  H.c.outcome).where(H.c.started_at >= start, H.c.started_at < end)).all()


def totals_since(session, since):
    """(command, outcome, runs, delivered, retried, dead, jobs_done, jobs_failed) over the runs started at
    or after `since`, one row per command and outcome: one range of the started_at index (GET /metrics)."""
    return session.execute(
        select(H.c.command, H.c.outcome, func.count(), func.sum(H.c.delivered), func.sum(H.c.retried),
               func.sum(H.c.dead), func.sum(H.c.jobs_done), func.sum(H.c.jobs_failed))
        .where(H.c.started_at >= since).group_by(H.c.command, H.c.outcome)).all()


def runs_of(session, command: str, pids: list[int], since) -> list[Heartbeat]:
    """The runs of `command` by processes `pids` of this host started at or after `since`: what a
    worker pool's children did (each writes its own row)."""
    if not pids:
        return []
    return list(session.scalars(select(Heartbeat).where(
        Heartbeat.command == command, Heartbeat.host == socket.gethostname()[:255], Heartbeat.pid.in_(pids),
        Heartbeat.started_at >= since)))
