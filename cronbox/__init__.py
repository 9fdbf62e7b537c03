"""cronbox: reliable events, background jobs and sealed files for a Flask app, run from cron.

The public API, all importable from here:

    from cronbox import Cronbox, record, consumer, job, RetryLater

    cronbox = Cronbox()                      # in your factory: cronbox.init_app(app, db=db)

    @consumer("appointment.paid", name="clinic.receipt")
    def receipt(event, ctx): ...             # run by the cron tick, at least once

    record(db.session, "appointment.paid", {"id": 7})   # in your transaction

- the extension: `Cronbox`;
- events: `record`, `consumer`, `forward` (to RabbitMQ), `Event`, `Context`;
- jobs: `job` (its `.dispatch()` and `.result()`), `batch`, `chain`, `cancel_batch`, `chain_progress`
  (`Batch`, `Chain`, `Progress`, `ChainProgress`, `ChainStep`, `JobResult`), and the channels' jobs
  `send_sms`, `send_email`, `send_webhook`, `notify`;
  `forward_jobs` (a queue's jobs run off RabbitMQ by `amqp work`, or by your Celery), `celery_task`
  (a task of your Celery's, dispatched in your transaction);
- periodic tasks: `schedule` (`@schedule.every(minutes=5)`, `@schedule.cron("0 3 * * *")`);
- errors: `CronboxError` (the root of cronbox's own), `RetryLater`, `PermanentFailure`;
- sealed files in your routes: `seal_upload`, `sealed_upload_route`, `upload_csrf_token`,
  `UploadRefused`, `BodyAlreadyRead`, `CsrfNotChecked`, and `request_client()` (who the audit
  names); the app's sealed storage is your extension's `storage` (`put`, `owner`, `grant`,
  `signed_url`, `revoke`, `open_file`), and outside an app the subpackage `cronbox.storage`;
- Alembic in your app: `alembic_include_name`, `alembic_include_object`.

Two more subpackages are documented, for what an app rarely needs: `cronbox.outbox` (settings,
the runtime) and `cronbox.cron` (the command line); and one for your tests, `cronbox.testing` (the test
kit and its pytest plugin: docs/testing.md). Every other module is internal: its names may change in
any release.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cron.schema import include_name as alembic_include_name
    from .cron.schema import include_object as alembic_include_object
    from .cron.scheduling import schedule  # the module: @schedule.every(...), @schedule.cron(...)
    from .web.extension import Cronbox
    from .web.hostauth import upload_csrf_token
    from .web.hostcsrf import CsrfNotChecked
    from .outbox.channels.jobs import notify, send_email, send_sms, send_webhook
    from .outbox.core.errors import CronboxError, PermanentFailure, RetryLater
    from .outbox.engine.context import Context, Event
    from .outbox.events.consumers import consumer
    from .outbox.events.forward import forward
    from .outbox.events.record import record
    from .outbox.queue.forward_jobs import celery_task, forward_jobs
    from .outbox.queue.jobs import job
    from .outbox.queue.batches import Batch, Chain, Progress, batch, cancel_batch, chain
    from .outbox.queue.chains import ChainProgress, ChainStep, chain_progress
    from .outbox.queue.results import JobResult
    from .web.uploads import BodyAlreadyRead, UploadRefused, request_client, seal_upload, sealed_upload_route

# Each public name: the module that defines it, and its name there (None: the module itself). Imported on first use (PEP 562):
# every cronbox process imports this package first (`python -m cronbox tick`, `import cronbox.outbox`),
# and a tick has no use for Flask, which the web parts import (~17 MB and a tenth of a second).
# An app's state (`cronbox.web.state.state(app)`) is internal, and not here: `state` is also that module's name.
_EXPORTS = {
    "Cronbox": (".web.extension", "Cronbox"),
    "record": (".outbox.events.record", "record"),
    "consumer": (".outbox.events.consumers", "consumer"),
    "forward": (".outbox.events.forward", "forward"),
    "Event": (".outbox.engine.context", "Event"),
    "Context": (".outbox.engine.context", "Context"),
    "job": (".outbox.queue.jobs", "job"),
    "batch": (".outbox.queue.batches", "batch"),
    "chain": (".outbox.queue.batches", "chain"),
    "cancel_batch": (".outbox.queue.batches", "cancel_batch"),
    "Batch": (".outbox.queue.batches", "Batch"),
    "Chain": (".outbox.queue.batches", "Chain"),
    "Progress": (".outbox.queue.batches", "Progress"),
    "chain_progress": (".outbox.queue.chains", "chain_progress"),
    "ChainProgress": (".outbox.queue.chains", "ChainProgress"),
    "ChainStep": (".outbox.queue.chains", "ChainStep"),
    "JobResult": (".outbox.queue.results", "JobResult"),
    "forward_jobs": (".outbox.queue.forward_jobs", "forward_jobs"),
    "celery_task": (".outbox.queue.forward_jobs", "celery_task"),
    "send_sms": (".outbox.channels.jobs", "send_sms"),
    "send_email": (".outbox.channels.jobs", "send_email"),
    "send_webhook": (".outbox.channels.jobs", "send_webhook"),
    "notify": (".outbox.channels.jobs", "notify"),
    "schedule": (".cron.scheduling.schedule", None),  # the module itself
    "CronboxError": (".outbox.core.errors", "CronboxError"),
    "RetryLater": (".outbox.core.errors", "RetryLater"),
    "PermanentFailure": (".outbox.core.errors", "PermanentFailure"),
    "seal_upload": (".web.uploads", "seal_upload"),
    "sealed_upload_route": (".web.uploads", "sealed_upload_route"),
    "upload_csrf_token": (".web.hostauth", "upload_csrf_token"),
    "request_client": (".web.uploads", "request_client"),
    "UploadRefused": (".web.uploads", "UploadRefused"),
    "BodyAlreadyRead": (".web.uploads", "BodyAlreadyRead"),
    "CsrfNotChecked": (".web.hostcsrf", "CsrfNotChecked"),
    "alembic_include_name": (".cron.schema", "include_name"),
    "alembic_include_object": (".cron.schema", "include_object"),
}

__all__ = [
    "Batch",
    "BodyAlreadyRead",
    "Chain",
    "ChainProgress",
    "ChainStep",
    "Context",
    "Cronbox",
    "CronboxError",
    "CsrfNotChecked",
    "Event",
    "JobResult",
    "PermanentFailure",
    "Progress",
    "RetryLater",
    "UploadRefused",
    "alembic_include_name",
    "alembic_include_object",
    "batch",
    "cancel_batch",
    "celery_task",
    "chain",
    "chain_progress",
    "consumer",
    "forward",
    "forward_jobs",
    "job",
    "notify",
    "record",
    "request_client",
    "schedule",
    "seal_upload",
    "sealed_upload_route",
    "send_email",
    "send_sms",
    "send_webhook",
    "upload_csrf_token",
]  # _EXPORTS' names (tests/units/test_public_api.py keeps them equal)


def __getattr__(name: str):
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'cronbox' has no attribute {name!r}") from None
    value = import_module(module, __name__)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
