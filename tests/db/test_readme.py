"""The README's Python snippets, run as written against a real database.

Each ```python block of README.md runs in order in one namespace holding what the README leaves to
the reader's app: `Session` (a sessionmaker), `payment` and `Notification` (the app's models), and
`request.stream` (an upload); the upload-route snippet gets `app`, a host Flask app with cronbox's
blueprints registered, and its route is then called with a real multipart form, with and without
Flask-WTF's token. Consumers and jobs register in this test's registry. Then the tick's
relay and worker run, and the effects the README promises are checked.
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
from cronbox import outbox
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
from cronbox import Cronbox

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")
SNIPPET = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


EXCERPT = re.compile(r"# (examples/\S+\.py)( \(abridged\))?\n")


def all_snippets(page: str = "README.md") -> list[str]:
    return SNIPPET.findall((APP_ROOT / page).read_text(encoding="utf-8"))


# Snippets run by a test of their own (below), each named by a line only it has.
OWN_TESTS = ("from clinic import cronbox, db", "from cronbox import record, schedule", "from cronbox import forward_jobs",
             "from cronbox import celery_task")


def readme_snippets() -> list[str]:
    """The snippets run in order by test_the_readme_snippets_run_as_written: all but the excerpts of
    the example app (whose own tests run them) and those with a test of their own."""
    return [s for s in all_snippets() if not EXCERPT.match(s) and not any(mark in s for mark in OWN_TESTS)]


def snippet_with(mark: str) -> str:
    [snippet] = [s for s in all_snippets() if mark in s]
    return snippet


@pytest.mark.parametrize("page", ["README.md", "docs/testing.md"])
def test_the_readme_excerpts_of_the_example_app_are_its_code(page):
    """A snippet opening with `# examples/...py` (abridged) shows lines of that file, in its order
    (`...` stands for lines left out): what the README (and docs/testing.md, the clinic's own tests)
    teaches is what examples/clinic's tests run."""
    excerpts = [s for s in all_snippets(page) if EXCERPT.match(s)]
    assert len(excerpts) >= 3
    for snippet in excerpts:
        first, *lines = snippet.splitlines()
        path = EXCERPT.match(first + "\n").group(1)
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


def test_the_readme_has_the_snippets_this_test_runs():
    snippets = readme_snippets()
    assert len(snippets) == 9
    assert "    record(" in snippets[0] and "\nforward(" in snippets[1] and ".dispatch(" in snippets[2]
    assert "send_sms.dispatch" in snippets[3] and "storage.put(" in snippets[4]
    assert "seal_upload(" in snippets[5]
    assert "include_name" in snippets[6]  # the host's env.py lines: run by test_host_alembic.py
    assert "console_operator=staff_only" in snippets[7]  # the host's login: test_console_host_auth.py's hook
    assert "def verify_cronbox_alert" in snippets[8]  # a webhook receiver's check: test_webhook.py runs it


def test_the_readme_snippets_run_as_written(runtime, registry, settings, monkeypatch, rabbit):
    metadata, Payment, Notification = app_models()
    metadata.create_all(runtime.engine)
    # The forwarding snippet's exchanges, in this session's own vhost, each with a queue bound.
    queues = {}
    for exchange in ("clinic", "audit", "lab"):
        rabbit.channel.exchange_declare(exchange, "topic", durable=True, auto_delete=False)
        rabbit.exchanges.append(exchange)
        queues[exchange] = rabbit.queue(exchange, "#", what=exchange)
    settings.raw["CRONBOX_AMQP_URL"] = rabbit.url
    monkeypatch.setattr(outbox, "consumer", partial(outbox.consumer, registry=registry))
    monkeypatch.setattr(outbox, "forward", partial(outbox.forward, registry=registry))
    monkeypatch.setattr(outbox, "job", partial(outbox.job, registry=registry))
    for name in ("consumer", "forward", "job"):  # the README's own spelling: from cronbox import consumer
        monkeypatch.setattr(cronbox, name, getattr(outbox, name))
    storage.configure(replace(settings, base_url="https://clinic.example"), runtime.sessions)
    namespace = {"Session": runtime.sessions, "payment": Payment("120.00"), "Notification": Notification,
                 "request": SimpleNamespace(stream=io.BytesIO(b"%PDF-1.7 a scan" * 1000))}
    snippets = readme_snippets()
    try:
        for snippet in snippets[:3]:
            exec(compile(snippet, "README.md", "exec"), namespace)
        with runtime.sessions.begin() as session:  # the channels snippet runs inside the reader's transaction
            exec(compile(snippets[3], "README.md", "exec"), {**namespace, "session": session})
        exec(compile(snippets[4], "README.md", "exec"), namespace)
        uploaded, refused = post_scans(runtime, snippets[5])
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
    assert jobs["send_reminder"] == "done"  # registered and run from the README's own decorator
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


def post_scans(runtime, snippet: str):
    """The upload snippet's route in a host Flask app with cronbox registered, then two uploads to it."""
    app = Flask("clinic")
    app.secret_key = "the host's"
    Cronbox().init_app(app, settings=runtime.settings).use_runtime(runtime)
    exec(compile(snippet, "README.md", "exec"),
         {"app": app, "Session": runtime.sessions, "__name__": "clinic.views"})  # the module the snippet is in
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
exec(compile(SNIPPET, "README.md", "exec"))
answer = app.test_client().get(link.removeprefix("https://clinic.example"))
print(link.split("/files/")[0], answer.status_code, answer.get_data(as_text=True))
"""


def test_the_host_app_storage_snippet_runs_in_the_example_app(runtime, env, tmp_path):
    """The README's `cronbox.storage` snippet, with examples/clinic's own names (`from clinic import
    cronbox, db`), in that app built by its factory: the link it makes downloads, and the keys are in
    the app's instance folder (`<instance>/cronbox/keys` by default; CRONBOX_INSTANCE here)."""
    snippet = snippet_with("from clinic import cronbox, db")
    instance = tmp_path / "clinic-instance"
    proc = subprocess.run(
        [sys.executable, "-c", f"SNIPPET = {snippet!r}\n" + HOSTED],
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


def test_the_periodic_tasks_snippet_runs_as_the_readme_says(runtime, registry, monkeypatch):
    """Each slot once (overlapping ticks skip it), the latest slot only after missed ones, `every` on UTC
    multiples and `cron` in its time zone."""
    monkeypatch.setattr(schedule, "every", partial(schedule.every, registry=registry))
    monkeypatch.setattr(schedule, "cron", partial(schedule.cron, registry=registry))
    exec(compile(snippet_with("from cronbox import record, schedule"), "README.md", "exec"), {})
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


def test_schedule_list_and_run_show_and_run_the_readmes_tasks(env, runtime, tmp_path):
    """The snippet as a CRONBOX_HANDLERS module: `schedule list` shows its tasks, `schedule run NAME`
    runs one now."""
    (tmp_path / "readme_tasks.py").write_text(snippet_with("from cronbox import record, schedule"))
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
    exec(compile(snippet_with("from cronbox import forward_jobs"), "README.md", "exec"), {})
    assert [q.broker_queue for q in registry.broker_queues.in_order()] == ["cronbox.jobs.sms", "cronbox.jobs.exports"]
    rabbit.queues += ["cronbox.jobs.sms", "cronbox.jobs.exports", "reports"]
    settings.raw["CRONBOX_AMQP_URL"] = rabbit.url
    exec(compile(snippet_with("from cronbox import celery_task"), "README.md", "exec"), {"Session": runtime.sessions})
    assert runtime.default_queues() == []  # none of them run in the tick
    publisher = JobPublisher(runtime)
    publisher.run(Budget(max_time=30, memory_mb=None))
    publisher.close()
    [message] = rabbit.take("reports")
    assert message.properties["application_headers"]["task"] == "reports.build"
    assert json.loads(message.body)[:2] == [[7], {}]
