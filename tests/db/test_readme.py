"""The README's Python snippets, run as written against a real database.

Each ```python block of README.md runs in order in one namespace holding what the README leaves to
the reader's app: `Session` (a sessionmaker), `payment` and `Notification` (the app's models), and
`request.stream` (an upload). Consumers and jobs register in this test's registry. Then the tick's
relay and worker run, and the effects the README promises are checked.
"""
from __future__ import annotations

import io
import re
from dataclasses import replace
from functools import partial
from types import SimpleNamespace

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.orm import registry as mapper_registry

import outbox
import storage
from outbox.engine.budget import Budget
from outbox.events.models import Delivery
from outbox.events.relay import Relay
from outbox.queue.models import Job
from outbox.queue.worker import Worker
from tests.conftest import APP_ROOT

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")
SNIPPET = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def readme_snippets() -> list[str]:
    return SNIPPET.findall((APP_ROOT / "README.md").read_text(encoding="utf-8"))


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
    assert len(snippets) == 5
    assert "outbox.record(" in snippets[0] and ".dispatch(" in snippets[1]
    assert "send_sms.dispatch" in snippets[2] and "storage.put(" in snippets[3]
    assert "include_name" in snippets[4]  # the host's env.py lines: run by test_host_alembic.py


def test_the_readme_snippets_run_as_written(runtime, registry, settings, monkeypatch):
    metadata, Payment, Notification = app_models()
    metadata.create_all(runtime.engine)
    monkeypatch.setattr(outbox, "consumer", partial(outbox.consumer, registry=registry))
    monkeypatch.setattr(outbox, "job", partial(outbox.job, registry=registry))
    storage.configure(replace(settings, base_url="https://clinic.example"), runtime.sessions)
    namespace = {"Session": runtime.sessions, "payment": Payment("120.00"), "Notification": Notification,
                 "request": SimpleNamespace(stream=io.BytesIO(b"%PDF-1.7 a scan" * 1000))}
    snippets = readme_snippets()
    try:
        for snippet in snippets[:2]:
            exec(compile(snippet, "README.md", "exec"), namespace)
        with runtime.sessions.begin() as session:  # the channels snippet runs inside the reader's transaction
            exec(compile(snippets[2], "README.md", "exec"), {**namespace, "session": session})
        exec(compile(snippets[3], "README.md", "exec"), namespace)
    finally:
        storage.configure(settings, runtime.sessions)  # a fresh default, not this test's, for later tests

    Relay(runtime).run(Budget(max_time=30, memory_mb=None))
    Worker(runtime, ["sms"]).run(Budget(max_time=30, memory_mb=None))
    with runtime.sessions() as session:
        assert session.scalars(select(Notification.appointment_id)).all() == [7]  # committed with the ack
        assert session.scalar(select(Delivery.status)) == "done"
        jobs = {j.handler: j.status for j in session.scalars(select(Job))}
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
