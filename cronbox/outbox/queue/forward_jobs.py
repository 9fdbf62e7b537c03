"""A job queue served by RabbitMQ: its due jobs are published to the broker instead of run in the tick.

    cronbox.forward_jobs("sms")                     # broker queue "cronbox.jobs.sms"
    cronbox.forward_jobs("reports", republish_after=3600)

`dispatch()` does not change: the job row is written in the caller's transaction. The tick's
publisher (outbox.queue.publisher) claims the queue's due jobs and publishes one small message per
job with publisher confirms; `python -m cronbox amqp work --queue sms` (outbox.queue.broker_worker),
on any host that reaches the database and the broker, runs them with the registered `@job`
functions. The tick's own worker leaves a forwarded queue alone (Runtime.default_queues).

No second state model: a job on the broker is its row in `reserved`, and the message carries the
row's id and claim token, nothing else (no payload on the broker). A broker worker takes the job by
that token (the row gets a token of the worker's own: only one copy of a message can take it) and
records the outcome on the row by the same token-guarded writes the database worker uses, in the
handler's transaction: a message delivered twice, or a copy published again, has its effect once. Retries, RetryLater, PermanentFailure, the failed
list, `queue retry`, rate limits, channel pauses and concurrency groups are the rows' and work
unchanged; a retried job is published again when it is due.

`republish_after`: a published job whose row is still reserved that long after the broker confirmed
it (its message lost with a deleted or purged queue, say) is published again, with the same token,
so a copy still waiting on the broker is not overtaken. Keep it above the longest a job may wait on
the broker.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.core.text import NAME_MAX
from cronbox.outbox.engine.registry import DEFAULT, Registry

if TYPE_CHECKING:
    from cronbox.outbox.queue.jobs import JobHandler

REPUBLISH_AFTER = 1800.0  # seconds
MAX_BROKER_QUEUE = 255  # an AMQP short string
CRONBOX, CELERY = "cronbox", "celery"
PROTOCOLS = (CRONBOX, CELERY)


def broker_queue_for(queue: str, protocol: str = CRONBOX) -> str:
    """The broker queue a cronbox queue's jobs go to by default: for cronbox's workers, named apart
    from the user's own; for Celery, the queue itself (what `celery worker -Q <queue>` consumes)."""
    return queue if protocol == CELERY else f"cronbox.jobs.{queue}"


@dataclass(frozen=True)
class BrokerQueue:
    """One job queue forwarded to the broker (the registry's `broker_queues`, keyed by the queue)."""
    name: str  # the job queue (a @job's `queue=`)
    broker_queue: str  # the AMQP queue its messages go to (default exchange, routing key = this name)
    republish_after: float
    protocol: str = CRONBOX  # "celery": Celery task messages, for the user's `celery worker` (celery_messages)
    fn: Callable | None = None  # nothing to call: a declaration
    module: str | None = None  # the module that called forward_jobs(): which app owns it

    @property
    def origin(self) -> tuple:
        """Declaring the same queue again the same way is fine (a module imported again); another way is
        a RegistrationError (outbox.engine.registry)."""
        return ("forward_jobs", self.broker_queue, self.republish_after, self.protocol)


def forward_jobs(queue: str, *, protocol: str = CRONBOX, broker_queue: str | None = None,
                 republish_after: float = REPUBLISH_AFTER, registry: Registry | None = None) -> BrokerQueue:
    """Send the due jobs of `queue` to RabbitMQ (CRONBOX_AMQP_URL) instead of running them in the tick:
    for `amqp work --queue QUEUE` to run (protocol "cronbox"), or as Celery task messages for the
    user's `celery worker -Q QUEUE` (protocol "celery": the job's name is the Celery task's, its
    payload the task's arguments; outbox.queue.celery_messages). `broker_queue`: the AMQP queue
    (default "cronbox.jobs.<queue>", or <queue> for Celery), declared durable by the publisher.
    `republish_after`: seconds after which a job confirmed but not taken by a worker is published
    again (its message lost with a purged queue, or no worker running). Returns the queue's
    declaration. Raises `RegistrationError` (a `CronboxError`) for a bad queue name, protocol,
    broker queue or `republish_after`."""
    return _declare(queue, protocol, broker_queue, republish_after, registry, _caller_module())


def _caller_module(depth: int = 2) -> str | None:
    frame = inspect.currentframe()
    for _ in range(depth):
        frame = frame.f_back if frame is not None else None
    return frame.f_globals.get("__name__") if frame is not None else None


def _declare(queue, protocol, broker_queue, republish_after, registry, module) -> BrokerQueue:
    from cronbox.outbox.queue.jobs import QUEUE_NAME  # the @job's rule for queue names

    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise RegistrationError(f"queue must be 1-64 letters, digits or _.:- characters, not {queue!r}")
    if protocol not in PROTOCOLS:
        raise RegistrationError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
    name = broker_queue_for(queue, protocol) if broker_queue is None else broker_queue
    if (not isinstance(name, str) or not name or len(name.encode("utf-8", "surrogatepass")) > MAX_BROKER_QUEUE
            or name.startswith("amq.") or not name.isprintable()):
        raise RegistrationError(f"broker_queue must be a printable AMQP queue name of 1 to {MAX_BROKER_QUEUE} bytes, "
                                f"not starting with 'amq.', not {broker_queue!r}")
    if isinstance(republish_after, bool) or not isinstance(republish_after, (int, float)) or republish_after < 1:
        raise RegistrationError(f"republish_after must be at least 1 second, not {republish_after!r}")
    declared = BrokerQueue(queue, name, float(republish_after), protocol, module=module)
    (registry or DEFAULT).broker_queues.add(declared)
    return declared


CELERY_PROTECTIONS = ("signing", "encryption")


def celery_task(name: str, *, queue: str = "celery", sealed: bool = False, celery_protects: str | None = None,
                registry: Registry | None = None) -> JobHandler:
    """A Celery task of the user's, named `name` (the name its Celery registered), sent to `queue`,
    dispatched in the caller's transaction like a job:

        build_report = cronbox.celery_task("reports.build", queue="reports")
        build_report.dispatch(db.session, [report_id])          # a list: the task's args
        build_report.dispatch(db.session, {"report_id": 7})     # a dict: its kwargs

    Its queue is forwarded with protocol "celery" (declared here if it is not yet): the tick publishes
    the task message once the transaction committed, and the row is done when the broker confirmed
    it; Celery's own retry rules apply from there. Returns the job (its `.dispatch`). Raises
    `RegistrationError` (a `CronboxError`) for a bad name, or a queue already forwarded to cronbox's
    own workers.

    sealed=True keeps the row sealed in the database (docs/howto/sealed-payloads.md), but a Celery task
    message carries its arguments as Celery's JSON: it is refused unless `celery_protects` says how your
    Celery protects its messages ("signing" or "encryption": Celery's `security_key` /
    `task_serializer="auth"` setup), i.e. you accept the arguments leaving the database opened."""
    from cronbox.outbox.engine.backoff import Backoff
    from cronbox.outbox.queue.jobs import JobHandler

    if not isinstance(name, str) or not name or len(name) > NAME_MAX - 60 or not name.isprintable():
        raise RegistrationError(f"a Celery task name must be printable text of 1 to {NAME_MAX - 60} characters, "
                                f"not {name!r}")
    if sealed and celery_protects not in CELERY_PROTECTIONS:
        raise RegistrationError(f"celery_task {name!r} is sealed, but Celery would put its arguments on the broker in "
                                "plaintext: set up Celery's message signing or encryption and say so with "
                                "celery_protects='signing' or 'encryption', or leave sealed=False")
    module = _caller_module()
    target = registry or DEFAULT
    forwarded = target.broker_queues.get(queue)
    if forwarded is None:
        _declare(queue, CELERY, None, REPUBLISH_AFTER, registry, module)
    elif forwarded.protocol != CELERY:
        raise RegistrationError(f"queue {queue} is forwarded to cronbox's workers: a Celery task needs a queue "
                                "forwarded with protocol='celery'")
    handler = JobHandler(name, queue, None, 1, Backoff.of(5), 30.0, False, None,  # type: ignore[arg-type]
                         jobs=target.jobs, module=module, sealed=bool(sealed))
    target.jobs.add(handler)
    return handler
