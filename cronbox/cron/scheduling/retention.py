"""Every table cronbox writes has a retention rule; they are all here.

| what | kept | pruned by |
|---|---|---|
| delivered events and their deliveries | 7 days (`outbox prune --older-than`) | daily task, `outbox prune` |
| dead / pending deliveries | until retried or skipped | never automatically |
| run heartbeats | 7 days (a running one that still beats: kept) | with the outbox |
| inbox rows (messages a broker consumer handled) | 14 days (`CRONBOX_INBOX_RETENTION_DAYS`) | daily task |
| redelivery counts of `amqp consume --ordered` (deleted when the message finishes; a crash's leftovers) | as the inbox | daily task |
| done jobs | 48 hours (`queue prune --older-than`) | daily task, `queue prune` |
| job results | `CRONBOX_RESULT_TTL` (7 days) | with the queue |
| finished batches whose members are all pruned | with the done jobs | with the queue |
| failed jobs | until retried, forgotten or flushed | `queue flush` |
| send attempts | 30 days | with the queue |
| read in-app notifications | 90 days | with the queue |
| rate-limit windows | 1 day | with the queue |
| scheduler slot runs | 30 days | daily task |
| one-off run requests | 30 days | daily task |
| sealed files whose row never committed | 24 hours | hourly `storage sweep` task |
| grants ended over 30 days ago, with their use rows | 30 days | hourly `storage sweep` task |
| file access audit | 6 years (`CRONBOX_AUDIT_RETENTION`, never less: HIPAA) | hourly `storage sweep` task |
| console sessions | until logout, 2 h idle or 12 h | daily task |
| console action log | as the file access audit (`CRONBOX_AUDIT_RETENTION`) | daily task |
"""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, select

from cronbox.cron.operator.models import OPS_SESSION_IDLE, OperatorAction, OperatorSession
from cronbox.outbox.channels.models import Notification, SendAttempt
from cronbox.outbox.core import clock
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine import heartbeat
from cronbox.outbox.events import deliveries, inbox, redeliveries
from cronbox.outbox.queue import batches, jobstore, ratelimit, results
from cronbox.outbox.queue.models import FAILED, DONE as JOB_DONE

BATCH = 500
OUTBOX_KEPT = timedelta(days=7)
DONE_JOBS_KEPT = timedelta(hours=48)
SEND_ATTEMPTS_KEPT = timedelta(days=30)
READ_NOTIFICATIONS_KEPT = timedelta(days=90)
RATE_WINDOWS_KEPT = timedelta(days=1)
OPS_KEPT = timedelta(days=30)


def _batches(rt, work) -> int:
    total = 0
    while batch := in_transaction(rt.sessions, work):
        total += batch
    return total


def prune_outbox(rt, older_than: float) -> tuple[int, int]:
    cutoff = clock.utcnow() - timedelta(seconds=older_than)
    return (_batches(rt, lambda s: deliveries.prune(s, cutoff, BATCH)),
            _batches(rt, lambda s: heartbeat.prune(s, cutoff, BATCH)))


def prune_inbox(rt) -> int:
    """Inbox rows older than CRONBOX_INBOX_RETENTION_DAYS, oldest first, in batches. A copy of a
    message that arrives after its row is gone runs the consumer again: the window must outlast
    any redelivery (a message parked in the dead queue and moved back later, a replay)."""
    cutoff = clock.utcnow() - timedelta(days=rt.settings.inbox_retention_days)
    return _batches(rt, lambda s: inbox.prune(s, cutoff, BATCH))


def prune_redeliveries(rt) -> int:
    """Redelivery counts not seen for the inbox's window: a count is deleted when its message is
    finished, so these are what a crash left between the count and the finish."""
    cutoff = clock.utcnow() - timedelta(days=rt.settings.inbox_retention_days)
    return _batches(rt, lambda s: redeliveries.prune(s, cutoff, BATCH))


def prune_queue(rt, older_than: float) -> dict[str, int]:
    now = clock.utcnow()
    before = now - timedelta(seconds=older_than)
    A, N = SendAttempt.__table__, Notification.__table__
    return {
        "done jobs": _batches(rt, lambda s: jobstore.delete_finished(s, JOB_DONE, before, BATCH)),
        "send attempts": in_transaction(rt.sessions, lambda s: s.execute(
            delete(A).where(A.c.created_at < now - SEND_ATTEMPTS_KEPT)).rowcount),
        "read notifications": in_transaction(rt.sessions, lambda s: s.execute(
            delete(N).where(N.c.read_at < now - READ_NOTIFICATIONS_KEPT)).rowcount),
        "rate windows": in_transaction(rt.sessions, lambda s: ratelimit.prune(s, now - RATE_WINDOWS_KEPT)),
        "job results": _batches(rt, lambda s: results.prune(s, now, BATCH)),
        "batches": _batches(rt, lambda s: batches.prune(s, before, BATCH)),
    }


def flush_failed(rt, older_than: float | None) -> int:
    before = clock.utcnow() - timedelta(seconds=older_than) if older_than is not None else None
    return _batches(rt, lambda s: jobstore.delete_finished(s, FAILED, before, BATCH))


def prune_ops(rt) -> dict[str, int]:
    from cronbox.cron.scheduling import once, schedule  # here: both import the command line, which imports this module

    now = clock.utcnow()
    before = now - OPS_KEPT
    actions_before = rt.settings.audit_cutoff(now)
    return {"schedule runs": _batches(rt, lambda s: schedule.prune(s, before, BATCH)),
            "one-off requests": _batches(rt, lambda s: once.prune(s, before, BATCH)),
            "console sessions": in_transaction(rt.sessions, lambda s: prune_console_sessions(s, now)),
            "console actions": _batches(rt, lambda s: prune_console_actions(s, actions_before))}


def prune_console_sessions(session, now) -> int:
    """Sessions past their end (the console deletes them at logout; this catches the abandoned ones)."""
    S = OperatorSession.__table__
    return session.execute(delete(S).where((S.c.expires_at <= now) | (S.c.seen_at <= now - OPS_SESSION_IDLE))).rowcount


def prune_console_actions(session, before) -> int:
    A = OperatorAction.__table__
    ids = list(session.scalars(select(A.c.id).where(A.c.at < before).order_by(A.c.id).limit(BATCH)))
    if ids:
        session.execute(delete(A).where(A.c.id.in_(ids)))
    return len(ids)


def prune_all(rt) -> dict[str, int]:
    rt.settings.audit_cutoff(clock.utcnow())  # a retention below its floor stops the whole prune, before any delete
    events, beats = prune_outbox(rt, OUTBOX_KEPT.total_seconds())
    return {"events": events, "heartbeats": beats, "inbox rows": prune_inbox(rt),
            "redelivery counts": prune_redeliveries(rt),
            **prune_queue(rt, DONE_JOBS_KEPT.total_seconds()), **prune_ops(rt)}
