"""The docs' Python snippets (README.md and docs/, tests/docs_snippets.py), run as written against a real
database.

The guides' blocks marked `<!-- run: tests/db/test_readme.py -->` run in order in one namespace
holding what the pages leave to the reader's app: `Session` (a sessionmaker), `payment` and
`Notification` (the app's models), and `request.stream` (an upload): docs/howto/events.md,
forward-rabbitmq.md, jobs.md, channels.md, sealed-files.md; the upload-route snippet
(docs/howto/uploads.md) gets `app`, a host Flask app with cronbox's blueprints registered, and its
route is then called with a real multipart form, with and without Flask-WTF's token. Consumers and
jobs register in this test's registry. Then the tick's relay and worker run, and the effects the
pages promise are checked. docs/howto/host-app.md's storage snippet, periodic-tasks.md,
jobs-rabbitmq.md and celery-outbox.md have tests of their own below; the excerpts of examples/clinic
(docs/tutorial.md) are checked against its files.
"""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from functools import partial
from types import SimpleNamespace

import pytest
from flask import Flask
from flask_wtf.csrf import generate_csrf
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.orm import registry as mapper_registry

import cronbox
from cronbox import storage
from cronbox.cron.scheduling import schedule
from cronbox.cron.scheduling.models import ScheduleRun
from cronbox.cron.scheduling.schedule import Scheduler
from cronbox.outbox.core import clock
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events.models import OutboxEvent as Event
from cronbox.outbox.events.models import Delivery
from cronbox.outbox.events.relay import Relay
from cronbox.outbox.queue.models import Job
from cronbox.outbox.queue.publisher import JobPublisher
from cronbox.outbox.queue.worker import Worker
from cronbox.storage.models import SealedFile
from tests.conftest import APP_ROOT, child_env, run_cli
from tests.docs_snippets import all_blocks, snippet
from cronbox import Cronbox

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")
# The snippets test_the_snippets_run_as_written runs, in order: (page, a line only that block has).
IN_ORDER = (("docs/howto/events.md", "    record("), ("docs/howto/forward-rabbitmq.md", "\nforward("),
            ("docs/howto/jobs.md", ".dispatch("), ("docs/howto/channels.md", "send_sms.dispatch"),
            ("docs/howto/sealed-files.md", "storage.put("))
UPLOAD = ("docs/howto/uploads.md", "seal_upload(")
HOSTED_STORAGE = ("docs/howto/host-app.md", "from clinic import cronbox, db")
SCHEDULE = ("docs/howto/periodic-tasks.md", "from cronbox import record, schedule")
FORWARD_JOBS = ("docs/howto/jobs-rabbitmq.md", "from cronbox import forward_jobs")
CELERY_TASK = ("docs/howto/celery-outbox.md", "from cronbox import celery_task")


def run(where: tuple[str, str], namespace: dict) -> None:
    page, mark = where
    exec(compile(snippet(page, mark), page, "exec"), namespace)


def test_the_excerpts_of_the_example_app_are_its_code():
    """A snippet opening with `# examples/...py` (abridged) shows lines of that file, in its order
    (`...` stands for lines left out): what the docs teach is what examples/clinic's tests run."""
    excerpts = [b for b in all_blocks() if b.excerpt]
    assert len(excerpts) >= 4
    for block in excerpts:
        first, *lines = block.code.splitlines()
        path = block.excerpt
        source = iter((APP_ROOT / path).read_text(encoding="utf-8").splitlines())
        for line in lines:
            if line.strip() in ("", "..."):
                continue
            assert any(line.rstrip() == candidate.rstrip() for candidate in source), f"{path}: {line!r}"


def app_models():
    """What the README's snippets take from the host app: a payment and a Notification model."""
    metadata = MetaData()
    mapper = mapper_registry(metadata=metadata)
    payments = Table("readme_payments", metadata, Column("id", Integer, primary_key=True),
                     Column("amount", String(20)))
    notifications = Table("readme_notifications", metadata, Column("id", Integer, primary_key=True),
                          Column("appointment_id", Integer))

    class Payment:
        def __init__(self, amount):
            self.amount = amount

    class Notification:
        def __init__(self, appointment_id):
            self.appointment_id = appointment_id

    mapper.map_imperatively(Payment, payments)
    mapper.map_imperatively(Notification, notifications)
    return metadata, Payment, Notification


def test_the_snippets_run_as_written(runtime, registry, settings, monkeypatch, rabbit):
    metadata, Payment, Notification = app_models()
    metadata.create_all(runtime.engine)
    # The forwarding snippet's exchanges, in this session's own vhost, each with a queue bound.
    queues = {}
    for exchange in ("clinic", "audit", "lab"):
        rabbit.channel.exchange_declare(exchange, "topic", durable=True, auto_delete=False)
        rabbit.exchanges.append(exchange)
        queues[exchange] = rabbit.queue(exchange, "#", what=exchange)
    settings.raw["CRONBOX_AMQP_URL"] = rabbit.url
    for name in ("consumer", "forward", "job"):  # the docs' spelling, the one there is: from cronbox import consumer
        monkeypatch.setattr(cronbox, name, partial(getattr(cronbox, name), registry=registry))
    storage.configure(replace(settings, base_url="https://clinic.example"), runtime.sessions)
    namespace = {"Session": runtime.sessions, "payment": Payment("120.00"), "Notification": Notification,
                 "request": SimpleNamespace(stream=io.BytesIO(b"%PDF-1.7 a scan" * 1000))}
    try:
        for where in IN_ORDER[:3]:
            run(where, namespace)
        with runtime.sessions.begin() as session:  # the channels snippet runs inside the reader's transaction
            run(IN_ORDER[3], {**namespace, "session": session})
        run(IN_ORDER[4], namespace)
        uploaded, refused = post_scans(runtime, UPLOAD)
    finally:
        storage.configure(settings, runtime.sessions)  # a fresh default, not this test's, for later tests

    relay = Relay(runtime)
    relay.run(Budget(max_time=30, memory_mb=None))
    relay.close()
    Worker(runtime, ["sms"]).run(Budget(max_time=30, memory_mb=None))
    with runtime.sessions() as session:
        assert session.scalars(select(Notification.appointment_id)).all() == [7]  # committed with the ack
        assert dict(session.execute(select(Delivery.consumer, Delivery.status)).all()) == {
            "notify_patient": "done", "amqp:clinic:appointment.*": "done", "audit-feed": "done"}
        jobs = {j.handler: j.status for j in session.scalars(select(Job))}
    arrived = {exchange: rabbit.take(queue) for exchange, queue in queues.items()}
    assert [m.properties["type"] for m in arrived["clinic"]] == ["appointment.paid"]
    assert [m.delivery_info["routing_key"] for m in arrived["audit"]] == ["all"] and arrived["lab"] == []
    assert jobs["send_reminder"] == "done"  # registered and run from the page's own decorator
    assert {"cronbox.sms", "cronbox.email", "cronbox.notify"} <= set(jobs)  # dispatched in the transaction
    assert namespace["url"].startswith("/files/")
    assert namespace["link"].startswith("https://clinic.example/files/")
    with runtime.sessions() as session:
        opened = storage.open_file(session, namespace["file_id"])
        try:
            assert b"".join(opened.iter_range(0, opened.size)) == b"%PDF-1.7 a scan" * 1000
        finally:
            opened.close()

    assert refused.status_code == 400  # a form without a file: nothing kept
    assert uploaded.status_code == 201, uploaded.data
    answer = uploaded.get_json()
    assert answer["visit"] == "12" and answer["size"] == len(SCAN)
    with runtime.sessions() as session:
        assert session.get(SealedFile, answer["id"]).owner == "patient:5"
        opened = storage.open_file(session, answer["id"])
        try:
            assert b"".join(bytes(chunk) for chunk in opened.iter_range(0, opened.size)) == SCAN
        finally:
            opened.close()
        assert session.scalar(select(func.count()).select_from(SealedFile)) == 2  # put's and this one


SCAN = b"%PDF-1.7 an uploaded scan " * 40000  # 1 MiB: over Werkzeug's 500 KiB spool threshold


def post_scans(runtime, where: tuple[str, str]):
    """The upload snippet's route in a host Flask app with cronbox registered, then two uploads to it."""
    app = Flask("clinic")
    app.secret_key = "the host's"
    Cronbox().init_app(app, settings=runtime.settings).use_runtime(runtime)
    run(where, {"app": app, "Session": runtime.sessions, "__name__": "clinic.views"})  # a module, as CSRFProtect.exempt needs
    app.add_url_rule("/token", "token", generate_csrf)  # the host's page with the form
    client = app.test_client()
    token = client.get("/token").get_data(as_text=True)
    without_token = {"visit": "12", "scan": (io.BytesIO(SCAN), "knee.pdf", "application/pdf")}
    assert client.post("/patients/5/scans", data=without_token, content_type="multipart/form-data"
                       ).status_code == 400  # CSRFProtect's check, made by the decorator
    form = {"csrf_token": token, "visit": "12", "scan": (io.BytesIO(SCAN), "knee.pdf", "application/pdf")}
    return (client.post("/patients/5/scans", data=form, content_type="multipart/form-data"),
            client.post("/patients/5/scans", data={"csrf_token": token, "visit": "12"},
                        content_type="multipart/form-data"))


HOSTED = """
import io
from clinic import create_app

app = create_app()
scan = io.BytesIO(b"%PDF-1.7 a scan")
exec(compile(SNIPPET, "docs/howto/host-app.md", "exec"))
answer = app.test_client().get(link.removeprefix("https://clinic.example"))
print(link.split("/files/")[0], answer.status_code, answer.get_data(as_text=True))
"""


def test_the_host_app_storage_snippet_runs_in_the_example_app(runtime, env, tmp_path):
    """docs/howto/host-app.md's `cronbox.storage` snippet, with examples/clinic's own names (`from clinic import
    cronbox, db`), in that app built by its factory: the link it makes downloads, and the keys are in
    the app's instance folder (`<instance>/cronbox/keys` by default; CRONBOX_INSTANCE here)."""
    code = snippet(*HOSTED_STORAGE)
    instance = tmp_path / "clinic-instance"
    proc = subprocess.run(
        [sys.executable, "-c", f"SNIPPET = {code!r}\n" + HOSTED],
        env=child_env(env, CRONBOX_INSTANCE=str(instance), CRONBOX_BASE_URL="https://clinic.example",
                      CRONBOX_APP_ROOT=str(APP_ROOT / "examples" / "clinic")),
        cwd=APP_ROOT / "examples" / "clinic", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "https://clinic.example 200 %PDF-1.7 a scan"
    assert sorted(path.name[:4] for path in (instance / "keys").glob("*.key")) == ["enc-", "sig-"]


def run_ticks(runtime, *instants: str) -> list[int]:
    """The scheduler stage of one tick per instant (each a fresh process's, as cron starts them), with
    the clock frozen there; how many task runs each started."""
    ran = []
    for instant in instants:
        with clock.frozen(datetime.fromisoformat(instant)):
            ran.append(Scheduler(runtime).run(Budget(max_time=30, memory_mb=None)))
    return ran


def test_the_periodic_tasks_snippet_runs_as_its_page_says(runtime, registry, monkeypatch):
    """Each slot once (overlapping ticks skip it), the latest slot only after missed ones, `every` on UTC
    multiples and `cron` in its time zone."""
    monkeypatch.setattr(schedule, "every", partial(schedule.every, registry=registry))
    monkeypatch.setattr(schedule, "cron", partial(schedule.cron, registry=registry))
    run(SCHEDULE, {})
    assert {t.name: t.describe() for t in registry.tasks.all()} == {
        "clinic.reminders": "every 15m", "clinic.settle_escrow": "cron 0 3 * * * (Asia/Tehran)"}

    # First tick: both tasks' latest slots; a second tick in the same slots runs nothing.
    assert run_ticks(runtime, "2026-12-02 10:07", "2026-12-02 10:14") == [2, 0]
    # Slots 10:15 to 11:30 missed (no tick): one run, for the latest slot only; 03:00 Tehran next.
    assert run_ticks(runtime, "2026-12-02 11:50", "2026-12-02 23:29", "2026-12-02 23:31") == [1, 1, 2]
    with runtime.sessions() as session:
        runs = session.execute(select(ScheduleRun.task, ScheduleRun.slot, ScheduleRun.status)
                               .order_by(ScheduleRun.task, ScheduleRun.slot)).all()
        reminders = session.scalars(select(Event.payload).where(Event.type == "reminders.due").order_by(Event.id))
        assert [json.loads(p)["slot"] for p in reminders] == ["2026-12-02T10:00:00", "2026-12-02T11:45:00",
                                                 "2026-12-02T23:15:00", "2026-12-02T23:30:00"]
    assert [(task, f"{slot:%d %H:%M}", status) for task, slot, status in runs] == [
        ("clinic.reminders", "02 10:00", "ok"), ("clinic.reminders", "02 11:45", "ok"),
        ("clinic.reminders", "02 23:15", "ok"), ("clinic.reminders", "02 23:30", "ok"),
        ("clinic.settle_escrow", "01 23:30", "ok"), ("clinic.settle_escrow", "02 23:30", "ok")]  # 03:00 +03:30


def test_schedule_list_and_run_show_and_run_the_pages_tasks(env, runtime, tmp_path):
    """The snippet as a CRONBOX_HANDLERS module: `schedule list` shows its tasks, `schedule run NAME`
    runs one now."""
    (tmp_path / "readme_tasks.py").write_text(snippet(*SCHEDULE))
    extra = {"CRONBOX_HANDLERS": "readme_tasks", "PYTHONPATH": f"{APP_ROOT}:{tmp_path}"}
    listed = run_cli(env, "schedule", "list", **extra)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"clinic\.reminders +every 15m +never", listed.stdout), listed.stdout
    assert re.search(r"clinic\.settle_escrow +cron 0 3 \* \* \* \(Asia/Tehran\) +never", listed.stdout)
    ran = run_cli(env, "schedule", "run", "clinic.reminders", **extra)
    assert (ran.returncode, ran.stdout.strip()) == (0, "schedule run clinic.reminders: ok"), ran.stderr
    with runtime.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Event).where(Event.type == "reminders.due")) == 1
    unknown = run_cli(env, "schedule", "run", "clinic.nothing", **extra)
    assert unknown.returncode == 2 and "no task named 'clinic.nothing'" in unknown.stderr


def test_the_jobs_on_rabbitmq_and_celery_snippets_run_as_written(runtime, registry, settings, monkeypatch, rabbit):
    """forward_jobs declares the queues the tick then leaves to `amqp work`; celery_task's dispatch in a
    transaction becomes a Celery task message on the broker once published."""
    for name in ("forward_jobs", "celery_task"):
        monkeypatch.setattr(cronbox, name, partial(getattr(cronbox, name), registry=registry))
    run(FORWARD_JOBS, {})
    assert [q.broker_queue for q in registry.broker_queues.in_order()] == ["cronbox.jobs.sms", "cronbox.jobs.exports"]
    rabbit.queues += ["cronbox.jobs.sms", "cronbox.jobs.exports", "reports"]
    settings.raw["CRONBOX_AMQP_URL"] = rabbit.url
    run(CELERY_TASK, {"Session": runtime.sessions})
    assert runtime.default_queues() == []  # none of them run in the tick
    publisher = JobPublisher(runtime)
    publisher.run(Budget(max_time=30, memory_mb=None))
    publisher.close()
    [message] = rabbit.take("reports")
    assert message.properties["application_headers"]["task"] == "reports.build"
    assert json.loads(message.body)[:2] == [[7], {}]
