"""The clinic's cronbox handlers (CRONBOX_HANDLERS=clinic.handlers), written as a Flask app's code:
`Model.query`, `db.session` and `current_app`, next to cronbox's own `ctx.session`.

What the tests steer, through the environment of the cron process:
CLINIC_FAIL=1             the consumer and the task raise after writing through both sessions
CLINIC_INSIDE_FILE / CLINIC_RELEASE_FILE  the consumer writes the first (with the number of connections
                          the process's database sees, on a server) and waits for the second
CLINIC_WANDER=<folder>    the scan job first moves the working directory, CRONBOX_INSTANCE and
                          CRONBOX_APP_ROOT there, as a careless handler might
"""
from __future__ import annotations

import io
import os
import time
from pathlib import Path

from flask import current_app
from sqlalchemy import text

import clinic
import cronbox
from cronbox import storage
import web
from clinic import db  # the factory has returned by now: cronbox imports handlers after it
from clinic.models import Appointment, Note
from cronbox.cron.scheduling import schedule

if clinic.factories_running:
    raise ImportError("clinic.handlers was imported while create_app() was still running")


CONNECTIONS = {
    "mysql": "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()",
    "postgresql": "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND backend_type = 'client backend'",
}


def _connections() -> str:
    count = CONNECTIONS.get(db.session.get_bind().dialect.name)
    return "-" if count is None else str(db.session.execute(text(count)).scalar_one())


def _block() -> None:
    inside, release = os.environ.get("CLINIC_INSIDE_FILE"), os.environ.get("CLINIC_RELEASE_FILE")
    if not inside:
        return
    Path(inside).write_text(_connections())
    deadline = time.monotonic() + 60
    while release and not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@cronbox.consumer("appointment.paid", name="clinic.receipt", max_attempts=5, backoff=60)
def receipt(event, ctx):
    appointment = Appointment.query.filter_by(id=event.payload["appointment"]).one()
    appointment.status = "paid"
    db.session.add(Note(appointment_id=appointment.id, source="db.session",
                        text=web.receipt_text(appointment.id, current_app.name)))
    db.session.commit()  # releases the savepoint only: the note still commits with the ack
    ctx.session.add(Note(appointment_id=appointment.id, source="ctx.session",
                         text=web.receipt_text(appointment.id, "ctx")))
    ctx.session.flush()
    _block()
    if os.environ.get("CLINIC_FAIL"):
        raise RuntimeError(f"receipt for appointment {appointment.id} failed on purpose")


# A yearly slot: one run per fresh database, however long the tick (every minute ran it twice in a
# tick that crossed a minute).
@schedule.cron("0 0 1 1 *", name="clinic.summary")
def summary(ctx):
    paid = Appointment.query.filter_by(status="paid").count()
    db.session.add(Note(appointment_id=None, source="task db.session", text=f"{current_app.name}: {paid} paid"))
    ctx.session.add(Note(appointment_id=None, source="task ctx.session", text=f"slot {ctx.slot:%H:%M}"))
    db.session.flush()
    if os.environ.get("CLINIC_FAIL"):
        raise RuntimeError("summary failed on purpose")


@cronbox.job("scans", name="clinic.seal_scan")
def seal_scan(payload, ctx):
    """Seals a scan in a background job, through the module-level `storage.put()`: under the app's keys."""
    wander = os.environ.get("CLINIC_WANDER")
    if wander:
        os.chdir(wander)
        os.environ.update(CRONBOX_INSTANCE=wander, CRONBOX_APP_ROOT=wander)
    file_id = storage.put(ctx.session, io.BytesIO(payload["text"].encode()), filename="scan.txt",
                          content_type="text/plain", owner=payload["owner"])
    ctx.session.add(Note(appointment_id=None, source="scan", text=file_id))
