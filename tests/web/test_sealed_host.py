"""Sealed payloads inside a host app (issue 40): what a host's request writes, and what happens where the
app has no usable key vault.

The class of the defect that reverted the first merge: record() and dispatch() found their sealer
through the app's sealed storage, whose first use checks the schema on a connection of its own, inside
the caller's transaction. On SQLite that second connection waited on the request's own write lock
(`database is locked`, a 500 after the busy timeout) for every record(), sealed or not; on a server it
was one more connection per first request. Now a host's request works on its one connection whatever
it records, sealed or plain.

Without a usable key vault (a key folder cronbox refuses: readable by others, inside a web root) the
channel jobs, sealed by default, stay plain and keep being sent, said once in the log and by health;
what the app declared sealed, or everything under CRONBOX_SEAL_PAYLOADS=all, is refused with one line.
"""
from __future__ import annotations

import logging
import secrets

import pytest
from flask import request
from sqlalchemy import event, select

import cronbox
from cronbox import Cronbox
from cronbox.outbox.core import sealing
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.events.models import OutboxEvent
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from cronbox.web.state import state
from tests.web.test_extension import host_app, host_root  # noqa: F401  (host_root: the fixture)

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

MARKER = "PHI-MARKER your biopsy results are ready"


def host_url(database) -> str:
    """The host's own URL for the test's migrated database (psycopg2 on PostgreSQL, as many Flask apps)."""
    return database.url.replace("postgresql+psycopg:", "postgresql+psycopg2:")


def clinic(root, database, registry, **config):
    """A host app on the test's database. POST /write with a list of what to write (`plain`, `sealed_event`,
    `sms`, `sealed_job`) writes them in the host's one transaction: 200, or 409 with cronbox's refusal."""
    kind = f"appointment.paid.{secrets.token_hex(4)}"  # declarations are process-wide: a type of its own

    @consumer(kind, name=f"receipt-{kind}", sealed=True, registry=registry)
    def receipt(event, ctx):
        pass

    @job("results", name=f"results-{kind}", sealed=True, registry=registry)
    def results_ready(payload, ctx):
        pass

    app, db = host_app(root, host_url(database), **config)
    writes = {
        "plain": lambda n: cronbox.record(db.session, "visit.plain", {"visit": n}),
        "sealed_event": lambda n: cronbox.record(db.session, kind, {"patient": MARKER}),
        "sms": lambda n: cronbox.send_sms.dispatch(db.session, {"to": "+15550100", "text": f"{MARKER} {n}"}),
        "sealed_job": lambda n: results_ready.dispatch(db.session, {"text": MARKER}),
    }

    @app.post("/write")
    def write():
        try:
            for n, what in enumerate(request.get_json()):
                writes[what](n)
        except cronbox.CronboxError as refused:
            db.session.rollback()
            return str(refused), 409
        db.session.commit()
        return "written"

    return app, db, kind


def rows(runtime):
    with runtime.sessions() as session:
        events = {e.type: e.payload for e in session.scalars(select(OutboxEvent))}
        jobs = {j.handler: j.payload for j in session.scalars(select(Job))}
    return events, jobs


def test_a_hosts_first_request_records_and_dispatches_plain_and_sealed_on_its_one_connection(
        runtime, database, registry, host_root):
    app, db, kind = clinic(host_root, database, registry)
    st = Cronbox().init_app(app, db=db)
    checkouts: list[str] = []  # cronbox's own engine (not yet used: no schema checked, no storage built)
    event.listen(st.runtime.engine, "checkout", lambda *args: checkouts.append("checkout"))
    try:
        answer = app.test_client().post("/write", json=["plain", "sealed_event", "sms", "sealed_job"])
        assert answer.status_code == 200, answer.get_data(as_text=True)
        assert checkouts == []  # all of it on the host's one connection: no second one inside its transaction
        events, jobs = rows(runtime)
        assert events["visit.plain"] == '{"visit":0}'
        sealed = [events[kind], jobs["cronbox.sms"], jobs[f"results-{kind}"]]
        assert all(p.startswith("cbxp1:") and MARKER not in p for p in sealed)
        keys = sorted(p.name[:4] for p in (host_root / "instance" / "cronbox" / "keys").glob("*.key"))
        assert keys == ["enc-", "sig-"]  # the app's own key folder, made on first use
    finally:
        st.runtime.dispose()


def unusable_key_folder(root):
    """The host's key folder made readable by others: cronbox refuses to use it (storage.keys)."""
    folder = root / "instance" / "cronbox" / "keys"
    folder.mkdir(parents=True, mode=0o700)
    folder.chmod(0o755)
    return folder


def test_without_a_usable_vault_channel_jobs_stay_plain_said_once_and_declared_sealed_ones_are_refused(
        runtime, database, registry, host_root, caplog):
    from cronbox.cron.scheduling.health import run_checks

    folder = unusable_key_folder(host_root)
    app, db, kind = clinic(host_root, database, registry, CRONBOX_FILES="off")  # the files part would refuse it
    with caplog.at_level(logging.WARNING, logger="cronbox"):
        st = Cronbox().init_app(app, db=db)
    try:
        started = [r.getMessage() for r in caplog.records if r.name == "cronbox"]
        assert len(started) == 1 and "key vault is not usable" in started[0] and str(folder) in started[0]
        client = app.test_client()
        for what, name in (("sealed_job", f"job results-{kind}"), ("sealed_event", f"event type {kind!r}")):
            refused = client.post("/write", json=["plain", what])
            said = refused.get_data(as_text=True)
            assert refused.status_code == 409 and "\n" not in said, said
            assert said.startswith(f"{name} is sealed, but the key vault is not usable: the key folder {folder}"), said
        assert rows(runtime) == ({}, {})  # nothing of a refused request written

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cronbox"):
            for _ in range(2):
                answer = client.post("/write", json=["sms", "sms"])
                assert answer.status_code == 200, answer.get_data(as_text=True)
        said = [r.getMessage() for r in caplog.records if r.name == "cronbox"]
        assert len(said) == 1 and "job cronbox.sms stored unsealed" in said[0] and str(folder) in said[0], said
        assert MARKER not in said[0] and "+1555" not in said[0]
        with runtime.sessions() as session:
            payloads = session.scalars(select(Job.payload).where(Job.handler == "cronbox.sms")).all()
        assert len(payloads) == 4 and all(p.startswith('{"to"') for p in payloads)
        with app.app_context():
            [check] = [c for c in run_checks(state(app).runtime).checks if c.name == "payload_sealing"]
        assert check.status == "warn" and "key vault is not usable" in check.detail
    finally:
        st.runtime.dispose()


def test_seal_all_without_a_usable_vault_refuses_to_start_with_one_line(runtime, database, registry, host_root):
    folder = unusable_key_folder(host_root)
    app, db, _ = clinic(host_root, database, registry, CRONBOX_FILES="off", CRONBOX_SEAL_PAYLOADS="all")
    with pytest.raises(SettingsError) as refused:
        Cronbox().init_app(app, db=db)
    assert str(refused.value).startswith("CRONBOX_SEAL_PAYLOADS=all, but the key vault is not usable: the key "
                                         f"folder {folder}")
    assert "\n" not in str(refused.value)


def test_health_counts_channel_payloads_left_plain_and_seal_payloads_seals_them(runtime, env, monkeypatch):
    from cronbox.cron.scheduling.health import run_checks
    from tests.conftest import run_cli

    def sealing_check():
        [check] = [c for c in run_checks(runtime).checks if c.name == "payload_sealing"]
        return check

    assert sealing_check().status == "ok"
    monkeypatch.setattr(sealing, "_resolver", [])  # a process where nothing set a key vault up
    with sealing.using(None), runtime.sessions.begin() as session:
        for n in range(2):
            cronbox.send_sms.dispatch(session, {"to": "+15550100", "text": f"{MARKER} {n}"})
            cronbox.notify.dispatch(session, {"to": "7", "kind": "result", "title": "t", "body": MARKER})
    check = sealing_check()
    assert check.status == "warn" and check.value == 4 and "storage seal-payloads" in check.detail
    done = run_cli(env, "storage", "seal-payloads")
    assert done.returncode == 0 and "seal-payloads: 4 payloads sealed, 0 failed" in done.stdout, done.stderr
    assert sealing_check().status == "ok"
    with runtime.sessions() as session:
        assert all(p.startswith("cbxp1:") for p in session.scalars(select(Job.payload)))


def test_a_run_outside_the_app_context_seals_results_and_chains_under_the_apps_keys(runtime, database, registry,
                                                                                   host_root):
    """A worker's run seals what its jobs carry (a result, a sealed chain's next row) under its runtime's
    keys, as it opens their payloads: also where no app context says whose keys (a test kit draining
    outside one, a cron process whose handlers' contexts have ended)."""
    from cronbox.outbox.engine.budget import Budget
    from cronbox.outbox.queue.worker import Worker

    seen = []

    @job("host-results", name="host.lookup", sealed=True, registry=registry)
    def lookup(payload, ctx):
        return {"patient": MARKER}

    @job("host-results", name="host.step", sealed=True, registry=registry)
    def step(payload, ctx):
        seen.append(ctx.previous)
        return payload

    app, db = host_app(host_root, host_url(database))

    @app.post("/go")
    def go():
        job_id = lookup.dispatch(db.session, 1)
        cronbox.chain(db.session, [(step, 1), (step, 2)])
        db.session.commit()
        return str(job_id)

    st = Cronbox().init_app(app, db=db)
    try:
        job_id = int(app.test_client().post("/go").get_data(as_text=True))
        runtime.sealer_source = st.sealer  # the app's keys, as a cron command's runtime has them (attach_cron)
        with sealing.using(None):  # nothing else: outside the app's context, a hosted process has no sealer
            for _ in range(3):
                Worker(runtime, ["host-results"]).run(Budget(max_time=60, memory_mb=None))
        with runtime.sessions() as session:
            assert [(r.handler, r.status) for r in session.scalars(select(Job).order_by(Job.id))] == [
                ("host.lookup", "done"), ("host.step", "done"), ("host.step", "done")]
        assert seen == [None, 1]
        with app.app_context():
            assert lookup.result(db.session, job_id).value == {"patient": MARKER}
    finally:
        st.runtime.dispose()
