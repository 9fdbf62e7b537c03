"""Check it yourself: after a payment's whole path (the request, the cron tick's consumer, the receipt's SMS
and e-mail sent by the tick's worker), a patient's name, phone and e-mail are nowhere in plaintext where
cronbox keeps things: not in a row of its `cronbox_*` tables, not in a mysqldump of them (MariaDB), not in
the instance folder (keys, sealed files, cronbox's logs), not in the log output.

The SMS and e-mail jobs carry the patient's phone, e-mail and name (the e-mail says "Dear <name>"):
cronbox seals the channel jobs' payloads by default wherever a key vault is usable, and the clinic's is
(`<instance>/keys/`, made with its first key on first use; here CRONBOX_INSTANCE). The clinic forwards
nothing to a broker: cronbox's own tests grep a broker's queues.

The grep is a plain substring search of bytes: a control shows it finding the same markers where they are
by design (the clinic's own `clinic_patients` table, and the sealed jobs once revealed with the key).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import column, create_engine, inspect, select, table
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from conftest import STAFF

NAME = "Parisa PHIMARKER-Nikzad"
PHONE = "+989127770431"
EMAIL = "parisa.phimarker@example.org"
MARKERS = (NAME, PHONE, PHONE[-8:], EMAIL)  # the last 8 digits: the number without its country prefix


def rows_of(database_url: str, tables) -> dict[str, bytes]:
    """Every column of every row of the tables `tables(name)` accepts, as bytes, by table: the tables and their
    columns found by SQLAlchemy's reflection (a table a later cronbox adds is read too), the values as the
    database driver returns them (no type of ours in between)."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        reflected = inspect(engine)
        found = {}
        with engine.connect() as connection:
            for name in sorted(filter(tables, reflected.get_table_names())):
                rows = connection.execute(select(table(name, *(column(c["name"]) for c in reflected.get_columns(name)))))
                found[name] = b"\n".join(b"\t".join(as_bytes(value) for value in row) for row in rows)
        return found
    finally:
        engine.dispose()


def as_bytes(value) -> bytes:
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode()


def is_cronbox(name: str) -> bool:
    return name.startswith("cronbox_")


def mariadb_dump(database_url: str, tables: list[str]) -> bytes | None:
    """`mariadb-dump` (or `mysqldump`) of these tables, as a backup takes them; binary columns written as they
    are (no --hex-blob: hex would hide a plaintext blob from the grep). None where neither is installed."""
    binary = shutil.which("mariadb-dump") or shutil.which("mysqldump")
    if binary is None:
        return None
    url = make_url(database_url)
    env = {**os.environ, **({"MYSQL_PWD": url.password} if url.password else {})}
    done = subprocess.run([binary, "-h", url.host or "127.0.0.1", "-P", str(url.port or 3306),
                           "-u", url.username or "root", "--skip-ssl", url.database, *tables],
                          env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def instance_files(instance: Path) -> dict[str, bytes]:
    return {str(path.relative_to(instance)): path.read_bytes() for path in sorted(instance.rglob("*")) if path.is_file()}


def plaintext(places: dict[str, bytes]) -> dict[str, list[str]]:
    """Each marker found, with the places holding it."""
    found = {marker: [where for where, content in places.items() if marker.encode() in content] for marker in MARKERS}
    return {marker: where for marker, where in found.items() if where}


@pytest.fixture
def patient_paying(app):
    """A patient whose name, phone and e-mail are markers, with an appointment of 120.00: its id."""
    from clinic.models import Appointment, Patient, db

    with app.app_context():
        patient = Patient(name=NAME, phone=PHONE, email=EMAIL)
        db.session.add(patient)
        db.session.flush()
        appointment = Appointment(patient_id=patient.id, starts_at=datetime(2026, 12, 3, 9, 30), fee=Decimal("120.00"))
        db.session.add(appointment)
        db.session.commit()
        return appointment.id


@pytest.fixture
def cronbox_log(caplog):
    """This process's cronbox log records (the `cronbox` logger writes to the instance's logs, not to the root)."""
    logger = logging.getLogger("cronbox")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def test_no_phi_in_plaintext_after_a_payment_the_tick_and_its_sms_and_email(app, patient_paying, run_cron, instance,
                                                                             clinic_env, monkeypatch, cronbox_log):
    from clinic.models import db
    from cronbox.outbox.queue.models import Job

    monkeypatch.setenv("CRONBOX_LOG_STDERR", "on")  # the cron commands' log lines on their stderr too
    response = app.test_client().post(f"/appointments/{patient_paying}/pay", json={"amount": "120.00"}, headers=STAFF)
    assert response.status_code == 201
    ticks = [run_cron("tick", "--no-linger"), run_cron("tick", "--no-linger")]  # the second finds nothing left
    output = [done.stdout + done.stderr for done in ticks]  # what cron mails, and the log lines
    with app.app_context():
        jobs = {job.handler: (job.id, job.status) for job in db.session.scalars(select(Job))}
    assert {handler: status for handler, (_id, status) in jobs.items()} == {"cronbox.sms": "done",
                                                                           "cronbox.email": "done"}

    # What an operator sees of them: `payload: sealed (N bytes, key enc-...)`.
    for job_id, _status in jobs.values():
        shown = run_cron("queue", "show", str(job_id))
        assert "payload: sealed (" in shown.stdout, shown.stdout
        output.append(shown.stdout + shown.stderr)

    # The control: the rows do hold the markers, sealed: the key opens them. A reveal is audited (in a
    # cronbox_* table, searched below); its text is on its stdout only, left out of the output searched.
    revealed = ""
    for job_id, _status in jobs.values():
        reveal = run_cron("queue", "show", str(job_id), "--reveal", "--reason", "check it yourself: test_phi")
        revealed += reveal.stdout
        output.append(reveal.stderr)
    assert set(plaintext({"revealed": revealed.encode()})) == set(MARKERS)

    url = clinic_env["DATABASE_URL"]
    places = {f"table {name}": content for name, content in rows_of(url, is_cronbox).items()}
    assert {"table cronbox_jobs", "table cronbox_events", "table cronbox_send_attempts"} <= set(places)
    if make_url(url).get_backend_name() == "mysql":
        # cronbox's tables only: the clinic's own (clinic_patients) hold the name, phone and e-mail by design.
        dump = mariadb_dump(url, sorted(name.removeprefix("table ") for name in places))
        if dump is not None:
            places["mariadb-dump of the cronbox_* tables"] = dump
            # The control: the same dump of the clinic's patients finds them all.
            assert set(plaintext({"dump": mariadb_dump(url, ["clinic_patients"])})) == set(MARKERS)
    places.update({f"instance/{name}": content for name, content in instance_files(instance).items()})
    assert any(name.startswith("instance/logs/cronbox-") for name in places)  # cronbox's logs are there
    log_output = "".join(output) + cronbox_log.text
    assert "sms (log driver)" in log_output and "mail (log driver)" in log_output  # the sends were logged
    places["log output"] = log_output.encode()

    assert plaintext(places) == {}

    # The control: the same search over the clinic's own patients table finds every marker.
    assert set(plaintext(rows_of(url, lambda name: name == "clinic_patients"))) == set(MARKERS)
