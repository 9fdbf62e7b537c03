"""The broker consumer's rows as tests read and seed them: the inbox (outbox.events.inbox) and the
redelivery counts (outbox.events.redeliveries), with plain SQLAlchemy. cronbox itself only ever
takes an inbox row as an attempt's first statement (inbox.take_first) and counts redeliveries.
And publish_jobs: one pass of the tick's job publisher (forwarded queues' jobs to the broker)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from cronbox.outbox.events import inbox
from cronbox.outbox.events.models import InboxEntry, Redelivery

INBOX = InboxEntry.__table__
REDELIVERIES = Redelivery.__table__


def take(runtime, consumer: str, message_id: str, now: datetime, event_type: str = "t") -> bool:
    """inbox.take_first as the broker consumer runs it: the first statement of a transaction of its
    own, committed when the row was taken, rolled back on a duplicate."""
    with runtime.engine.connect() as connection:
        transaction = connection.begin()
        taken = inbox.take_first(connection, consumer, message_id, event_type, None, now)
        if taken:
            transaction.commit()
        else:
            transaction.rollback()
    return taken


def add_inbox_row(session: Session, consumer: str, message_id: str, received_at: datetime) -> None:
    session.execute(insert(INBOX).values(consumer=consumer, message_id=message_id, event_type="t",
                                         received_at=received_at))


def inbox_has(session: Session, consumer: str, message_id: str) -> bool:
    return session.execute(select(INBOX.c.consumer).where(INBOX.c.consumer == consumer,
                                                          INBOX.c.message_id == message_id)).first() is not None


def inbox_count(session: Session, consumer: str | None = None) -> int:
    query = select(func.count()).select_from(INBOX)
    if consumer is not None:
        query = query.where(INBOX.c.consumer == consumer)
    return session.scalar(query)


def redelivery_times(session: Session, queue: str, message_id: str) -> int:
    """The message's redelivery count; 0 when it has no row."""
    return session.scalar(select(REDELIVERIES.c.times).where(REDELIVERIES.c.queue == queue,
                                                             REDELIVERIES.c.message_id == message_id)) or 0


def publish_jobs(runtime, amqp_url: str | None = None):
    """One pass of the tick's job publisher (outbox.queue.publisher), to `amqp_url` if given; its stats."""
    from cronbox.outbox.engine.budget import Budget
    from cronbox.outbox.queue.publisher import JobPublisher

    if amqp_url is not None:
        runtime.settings.raw["CRONBOX_AMQP_URL"] = amqp_url  # raw is this test's own dict
    publisher = JobPublisher(runtime)
    try:
        publisher.run(Budget(max_time=30, memory_mb=None))
    finally:
        publisher.close()
    return publisher
