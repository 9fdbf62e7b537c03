"""Sealed payloads on every backend: sealed on write in the caller's one INSERT, opened at claim in the
worker's memory, and every altered, copied or orphaned envelope refused for its item alone (issue 40)."""
from __future__ import annotations

import secrets

import pytest
from sqlalchemy import select, text, update

import cronbox
from cronbox.outbox.core import sealing
from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.events.models import Delivery, OutboxEvent
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import FAILED, Job
from cronbox.outbox.queue.worker import Worker
from cronbox.storage import keys
from cronbox.storage.payload_keys import sealer_of
from tests.helpers import relay

MARKER = "BIOPSY-RESULTS-READY-4711"


@pytest.fixture
def sealer(runtime, settings):
    sealer = sealer_of(settings)
    runtime.sealer_source = lambda: sealer
    with sealing.using(sealer):
        yield sealer


def work(rt, queues=None):
    worker = Worker(rt, queues)
    worker.run(Budget(max_time=30, memory_mb=None))
    return worker.stats


def jobs_of(rt) -> list[Job]:
    with rt.sessions() as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def dispatch(rt, fn, payload) -> int:
    with rt.sessions.begin() as session:
        return fn.dispatch(session, payload)


def test_a_sealed_job_is_stored_as_an_envelope_and_its_handler_gets_the_payload(runtime, registry, sealer):
    seen = []

    @job("sms", sealed=True, registry=registry)
    def text_patient(payload, ctx):
        seen.append(payload)

    @job("plain", registry=registry)
    def plain(payload, ctx):
        seen.append(payload)

    dispatch(runtime, text_patient, {"to": "+15550100", "text": MARKER})
    dispatch(runtime, plain, {"n": 1})
    rows = jobs_of(runtime)
    assert rows[0].payload.startswith("cbxp1:") and MARKER not in rows[0].payload and rows[0].seal_id
    assert sealing.describe(rows[0].payload).startswith("sealed (") and rows[1].seal_id is None
    assert rows[0].payload_bytes == len(rows[0].payload)
    work(runtime, ["sms", "plain"])
    assert seen == [{"to": "+15550100", "text": MARKER}, {"n": 1}]


def test_an_event_type_declared_sealed_is_sealed_whoever_records_it(runtime, registry, sealer):
    kind = f"appointment.paid.{secrets.token_hex(4)}"  # declarations are process-wide: a type of its own
    seen = []

    @consumer(kind, name=f"c-{kind}", sealed=True, registry=registry)
    def on_paid(event, ctx):
        seen.append(event.payload)

    @consumer(kind, name=f"d-{kind}", registry=registry)  # unsaid: never unseals the type
    def also(event, ctx):
        seen.append(event.payload)

    with runtime.sessions.begin() as session:
        recorded = cronbox.record(session, kind, {"patient": MARKER})
        with pytest.raises(PayloadError, match="declared sealed"):
            cronbox.record(session, kind, {"x": 1}, sealed=False)
    assert recorded.payload.startswith("cbxp1:")
    with runtime.sessions() as session:
        stored = session.scalars(select(OutboxEvent.payload)).one()
    assert MARKER not in stored
    relay(runtime)
    assert seen == [{"patient": MARKER}] * 2


def test_sealed_dispatch_without_a_vault_fails_at_dispatch_with_one_line(runtime, registry, monkeypatch):
    @job("sms", sealed=True, registry=registry)
    def text_patient(payload, ctx):
        pass

    monkeypatch.setattr(sealing, "_resolver", [])  # a process where nothing set a key vault up
    with sealing.using(None), runtime.sessions.begin() as session:
        with pytest.raises(PayloadError, match="no key vault is configured") as refused:
            text_patient.dispatch(session, {"to": "+15550100"})
        with pytest.raises(PayloadError, match="no key vault"):
            cronbox.record(session, "x", {}, sealed=True)
    assert "\n" not in str(refused.value)
    assert jobs_of(runtime) == []


def test_seal_all_seals_every_job_and_event(runtime, registry, settings):
    from dataclasses import replace

    sealer = sealer_of(replace(settings, seal_payloads="all"))
    runtime.sealer_source = lambda: sealer
    seen = []

    @job("q", registry=registry)
    def anything(payload, ctx):
        seen.append(payload)

    with sealing.using(sealer):
        dispatch(runtime, anything, [MARKER])
        with runtime.sessions.begin() as session:
            event = cronbox.record(session, "x.all", {"m": MARKER})
    assert event.payload.startswith("cbxp1:") and jobs_of(runtime)[0].payload.startswith("cbxp1:")
    work(runtime, ["q"])
    assert seen == [[MARKER]]


def _tamper_cases(runtime, sealer):
    """(description, how to alter row 2) for each way an envelope can be altered or moved."""
    other_key = None

    def swap_with_row_1(connection, rows):
        connection.execute(update(Job).where(Job.id == rows[1].id).values(payload=rows[0].payload))

    def from_events(connection, rows):
        with sealing.using(sealer):
            event = cronbox.record(connection, "moved", {"text": MARKER}, sealed=True)
        seal_id = connection.execute(select(OutboxEvent.seal_id).where(OutboxEvent.id == event.id)).scalar()
        connection.execute(update(OutboxEvent).where(OutboxEvent.id == event.id).values(seal_id=None))
        connection.execute(update(Job).where(Job.id == rows[1].id).values(payload=event.payload, seal_id=seal_id))

    def flip(position):
        def alter(connection, rows):
            envelope = rows[1].payload
            body = envelope.rsplit(":", 1)[1]
            index = len(envelope) - len(body) + position % len(body)
            replacement = "A" if envelope[index] != "A" else "B"
            connection.execute(update(Job).where(Job.id == rows[1].id).values(
                payload=envelope[:index] + replacement + envelope[index + 1:]))
        return alter

    def truncate(connection, rows):
        connection.execute(update(Job).where(Job.id == rows[1].id).values(payload=rows[1].payload[:-5]))

    def key_id(connection, rows):
        nonlocal other_key
        other_key = keys.new_key(runtime.settings, keys.ENCRYPTION)
        prefix, _, rest = rows[1].payload.split(":", 2)
        connection.execute(update(Job).where(Job.id == rows[1].id).values(payload=f"{prefix}:{other_key}:{rest}"))

    def other_database(connection, rows):  # the same keys, another install: as if copied between databases
        connection.execute(text("UPDATE cronbox_install SET install_id = :i"), {"i": secrets.token_hex(16)})

    return [("copied from another row", swap_with_row_1),
            ("copied from the events table", from_events), ("a nonce bit", flip(0)), ("a body bit", flip(20)),
            ("a tag bit", flip(-1)), ("truncated", truncate), ("another key id", key_id),
            ("another database", other_database)]


@pytest.mark.parametrize("case", range(8))
def test_an_altered_or_moved_envelope_fails_its_item_alone_and_its_row_stays(runtime, registry, sealer, case):
    seen = []

    @job("sms", sealed=True, tries=1, registry=registry)
    def text_patient(payload, ctx):
        seen.append(payload)

    for n in range(3):
        dispatch(runtime, text_patient, {"n": n, "text": MARKER})
    name, alter = _tamper_cases(runtime, sealer)[case]
    rows = jobs_of(runtime)
    with runtime.engine.begin() as connection:
        alter(connection, rows)
    if name == "another database":  # a fresh sealer: this process had read the install id already
        fresh = sealer_of(runtime.settings)
        runtime.sealer_source = lambda: fresh
    stored = {r.id: r.payload for r in jobs_of(runtime)}
    work(runtime, ["sms"])
    after = jobs_of(runtime)
    if name == "another database":  # every row of the database was "moved": none opens
        assert seen == [] and all(r.status == FAILED for r in after)
    else:
        assert seen == [{"n": 0, "text": MARKER}, {"n": 2, "text": MARKER}], name
        assert after[1].status == FAILED
    failed = [r for r in after if r.status == FAILED]
    assert all("sealed payload" in (r.last_error or "") for r in failed)
    assert all(MARKER not in (r.last_error or "") + (r.traceback or "") for r in after)
    assert {r.id: r.payload for r in after} == stored  # nothing rewritten, nothing deleted


def test_a_bad_envelope_is_one_integrity_line_for_its_item_and_the_run_goes_on(runtime, registry, sealer, caplog):
    """A job's and a delivery's envelope that does not open each make one log line, their outcome's,
    naming the integrity error: never "could not record the outcome" (nothing failed to record)."""
    import logging

    kind = f"tampered.{secrets.token_hex(4)}"
    seen = []

    @job("sms", name=f"job-{kind}", sealed=True, tries=2, registry=registry)
    def text_patient(payload, ctx):
        seen.append(payload["n"])

    @consumer(kind, name=f"c-{kind}", sealed=True, max_attempts=1, registry=registry)
    def on_result(event, ctx):
        seen.append(event.payload["n"])

    ids = [dispatch(runtime, text_patient, {"n": n, "text": MARKER}) for n in range(3)]
    with runtime.sessions.begin() as session:
        events = [cronbox.record(session, kind, {"n": 10 + n, "text": MARKER}).id for n in range(3)]
    flip, rows = _tamper_cases(runtime, sealer)[3][1], jobs_of(runtime)  # a body bit
    with runtime.engine.begin() as connection:
        flip(connection, rows)
        envelope = connection.execute(select(OutboxEvent.payload).where(OutboxEvent.id == events[1])).scalar()
        connection.execute(update(OutboxEvent).where(OutboxEvent.id == events[1]).values(
            payload=envelope[:-4] + ("AAAA" if envelope[-4:] != "AAAA" else "BBBB")))
    with caplog.at_level(logging.INFO, logger="cronbox"):
        work(runtime, ["sms"])
        relay(runtime)
    assert sorted(seen) == [0, 2, 10, 12]  # the others ran
    lines = [r.getMessage() for r in caplog.records if r.name == "cronbox"]
    assert not [line for line in lines if "could not record" in line], lines
    for subject in (f"job={ids[1]} ", f"event={events[1]} "):
        about = [line for line in lines if subject in line]
        assert len(about) == 1, (subject, lines)
        assert "PayloadIntegrityError: sealed payload does not authenticate" in about[0], about
        assert MARKER not in about[0]
    assert jobs_of(runtime)[1].status == "ready" and jobs_of(runtime)[1].attempts == 1  # retried by its policy
    with runtime.sessions() as session:
        dead = session.scalars(select(Delivery).where(Delivery.event_id == events[1])).one()
        assert dead.status == "dead" and "PayloadIntegrityError" in dead.last_error


def test_an_envelope_copied_with_its_seal_id_into_a_second_row_is_refused_by_the_database(runtime, registry,
                                                                                         sealer):
    """The seal id is the row's identity (docs/sealed-format.md): unique, so no second row can carry it."""
    import sqlalchemy.exc

    @job("sms", name="sms-copied", sealed=True, registry=registry)
    def text_patient(payload, ctx):
        pass

    for n in range(2):
        dispatch(runtime, text_patient, {"n": n})
    rows = jobs_of(runtime)
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        with runtime.engine.begin() as connection:
            connection.execute(update(Job).where(Job.id == rows[1].id).values(payload=rows[0].payload,
                                                                               seal_id=rows[0].seal_id))


def test_a_row_whose_key_is_gone_fails_with_the_key_named_and_stays(runtime, registry, sealer, settings):
    @job("sms", sealed=True, tries=1, registry=registry)
    def text_patient(payload, ctx):
        raise AssertionError("never called")

    dispatch(runtime, text_patient, {"text": MARKER})
    key_id = jobs_of(runtime)[0].payload.split(":")[1]
    keys.new_key(settings, keys.ENCRYPTION)
    (settings.key_folder / f"{key_id}.key").unlink()
    fresh = sealer_of(settings)
    runtime.sealer_source = lambda: fresh
    work(runtime, ["sms"])
    [row] = jobs_of(runtime)
    assert row.status == FAILED and key_id in row.last_error and "not in the key folder" in row.last_error


def test_a_grouped_consumer_of_a_sealed_type_runs_alone_and_a_bad_envelope_does_not_stop_the_run(
        runtime, registry, sealer):
    kind = f"grouped.{secrets.token_hex(4)}"
    seen = []

    @consumer(kind, name=f"g-{kind}", grouped=True, sealed=True, max_attempts=1, registry=registry)
    def grouped(event, ctx):
        seen.append(event.payload["n"])

    with runtime.sessions.begin() as session:
        for n in range(3):
            cronbox.record(session, kind, {"n": n})
    with runtime.engine.begin() as connection:
        first = connection.execute(select(OutboxEvent.id).order_by(OutboxEvent.id)).first()[0]
        connection.execute(update(OutboxEvent).where(OutboxEvent.id == first + 1).values(
            payload=f"cbxp1:{'x' * 30}"))
    relay(runtime)
    assert seen == [0, 2]
    with runtime.sessions() as session:
        statuses = [d.status for d in session.scalars(select(Delivery).order_by(Delivery.id))]
    assert statuses == ["done", "dead", "done"]


@pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")
def test_show_masks_and_a_reveal_needs_a_reason_and_is_audited(runtime, registry, sealer, env):
    from cronbox.storage import payload_reveal
    from tests.conftest import run_cli

    @job("sms", name="cronbox-test.reveal", sealed=True, registry=registry)
    def text_patient(payload, ctx):
        pass

    job_id = dispatch(runtime, text_patient, {"text": MARKER})
    masked = run_cli(env, "queue", "show", str(job_id))
    assert masked.returncode == 0 and "payload: sealed (" in masked.stdout and MARKER not in masked.stdout
    refused = run_cli(env, "queue", "show", str(job_id), "--reveal")
    assert refused.returncode == 1 and "--reason" in refused.stderr and MARKER not in refused.stdout
    shown = run_cli(env, "queue", "show", str(job_id), "--reveal", "--reason", "ticket 12: patient asked")
    assert shown.returncode == 0 and MARKER in shown.stdout
    with runtime.sessions() as session:
        [entry] = payload_reveal.revealed_entries(session, f"job:{job_id}")
    assert entry.outcome == "ok" and "ticket 12: patient asked" in entry.detail and entry.detail.startswith("by cli:")
    missing = run_cli(env, "outbox", "show", "999")
    assert missing.returncode == 1 and "no event 999" in missing.stderr


@pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")
def test_health_names_a_missing_payload_key_before_a_worker_fails_on_it(runtime, registry, sealer, settings):
    from cronbox.cron.scheduling.health import run_checks

    @job("sms", name="cronbox-test.health", sealed=True, registry=registry)
    def text_patient(payload, ctx):
        pass

    dispatch(runtime, text_patient, {"text": MARKER})
    [check] = [c for c in run_checks(runtime).checks if c.name == "payload_keys"]
    assert check.status == "ok"
    key_id = jobs_of(runtime)[0].payload.split(":")[1]
    keys.new_key(settings, keys.ENCRYPTION)
    (settings.key_folder / f"{key_id}.key").unlink()
    [check] = [c for c in run_checks(runtime).checks if c.name == "payload_keys"]
    assert check.status == "fail" and key_id in check.detail


@pytest.mark.backends("sqlite", "mysql-token", "postgresql")
def test_rewrap_reseals_waiting_payloads_under_the_new_key_and_seal_seals_old_plaintext_rows(
        runtime, registry, sealer, settings):
    from cronbox.storage import payload_maintenance

    seen = []

    @job("sms", name="cronbox-test.rewrap", sealed=True, registry=registry)
    def text_patient(payload, ctx):
        seen.append(payload)

    @job("sms", name="cronbox-test.later", registry=registry)
    def later(payload, ctx):
        seen.append(payload)

    for n in range(5):
        dispatch(runtime, text_patient, {"n": n, "text": MARKER})
    dispatch(runtime, later, {"n": 9, "text": MARKER})  # plaintext, as written before sealing was turned on
    old = jobs_of(runtime)[0].payload.split(":")[1]
    new = keys.new_key(settings, keys.ENCRYPTION)
    fresh = sealer_of(settings)
    runtime.sealer_source = lambda: fresh
    result = payload_maintenance.rewrap(runtime.sessions, fresh, batch_size=2)
    assert result.done == 5 and result.failed == []
    assert all(r.payload.split(":")[1] == new for r in jobs_of(runtime)[:5])
    assert payload_maintenance.rewrap(runtime.sessions, fresh).done == 0  # resumable: nothing left
    sealed = payload_maintenance.seal_plaintext(runtime.sessions, fresh, jobs={"cronbox-test.later"}, event_types=set())
    assert sealed.done == 1 and MARKER not in jobs_of(runtime)[5].payload
    (settings.key_folder / f"{old}.key").unlink()  # the old key is no longer needed
    work(runtime, ["sms"])
    assert sorted(p["n"] for p in seen) == [0, 1, 2, 3, 4, 9]


def results_of(rt) -> dict[int, str]:
    from cronbox.outbox.queue.models import JobResult

    with rt.sessions() as session:
        return {row.job_id: row.value for row in session.scalars(select(JobResult))}


def test_seal_payloads_seals_a_waiting_chain_steps_flow_and_the_results_of_the_jobs_it_seals(runtime, registry,
                                                                                             sealer):
    """Written before `report` was sealed: a done report's result (readable for CRONBOX_RESULT_TTL), and a
    chain whose waiting first step, a job never sealed, carries report's payload in its flow. Sealing
    `report` in place seals both; the chain then runs sealed whole, its next step and results too."""
    from cronbox.storage import payload_maintenance

    seen = []

    @job("clinic", name="cronbox-test.scan", registry=registry)
    def scan(payload, ctx):
        return {"scan": payload["note"]}

    @job("clinic", name="cronbox-test.report", registry=registry)
    def report(payload, ctx):
        seen.append((payload, ctx.previous))
        return {"report": payload["note"]}

    done_id = dispatch(runtime, report, {"note": f"{MARKER} done"})
    work(runtime, ["clinic"])
    with runtime.sessions.begin() as session:
        cronbox.chain(session, [(scan, {"note": f"{MARKER} scan"}), (report, {"note": f"{MARKER} report"})])
    first = jobs_of(runtime)[1]
    assert first.seal_id is None and MARKER in first.flow and MARKER in results_of(runtime)[done_id]

    def seal_report():
        return payload_maintenance.seal_plaintext(runtime.sessions, sealer, jobs={"cronbox-test.report"},
                                                  event_types=set())

    sealed = seal_report()
    assert (sealed.done, sealed.failed) == (2, [])  # the chain's waiting step (payload and flow), the result
    first = jobs_of(runtime)[1]
    assert first.payload.startswith("cbxp1:") and first.flow.startswith("cbxp1:") and MARKER not in first.flow
    assert results_of(runtime)[done_id].startswith("cbxp1:")
    with runtime.sessions() as session:
        assert report.result(session, done_id).value == {"report": f"{MARKER} done"}
    assert seal_report().done == 0  # resumable: nothing left

    work(runtime, ["clinic"])
    assert seen == [({"note": f"{MARKER} done"}, None), ({"note": f"{MARKER} report"}, {"scan": f"{MARKER} scan"})]
    rows = jobs_of(runtime)
    assert [r.status for r in rows] == ["done"] * 3
    assert [MARKER in r.payload + (r.flow or "") for r in rows] == [True, False, False]  # the done row: retention's
    assert [MARKER in value for value in results_of(runtime).values()] == [False] * 3


@pytest.mark.backends("sqlite", "mysql-skip-locked")
def test_the_commands_seal_old_rows_and_reseal_after_a_new_key(runtime, registry, sealer, settings, env):
    from tests.conftest import run_cli

    @job("q", name="cronbox-test.cli", registry=registry)
    def plain(payload, ctx):
        pass

    dispatch(runtime, plain, {"text": MARKER})
    done = run_cli(env, "storage", "seal-payloads", "--all")
    assert done.returncode == 0 and "seal-payloads: 1 payloads sealed, 0 failed" in done.stdout, done.stderr
    first = jobs_of(runtime)[0].payload
    assert first.startswith("cbxp1:") and MARKER not in first
    new = keys.new_key(settings, keys.ENCRYPTION)
    rewrapped = run_cli(env, "storage", "rewrap")
    assert rewrapped.returncode == 0 and "1 sealed payloads re-sealed" in rewrapped.stdout, rewrapped.stderr
    assert jobs_of(runtime)[0].payload.split(":")[1] == new


@pytest.mark.backends("mysql-skip-locked")
def test_no_marker_in_a_mysqldump_the_instance_folder_or_the_logs_after_a_run(runtime, settings, env, database):
    """Issue 40's plaintext grep: a sealed event recorded by the app, its consumer texting the patient and
    dispatching a sealed job, all run by a real tick; then nothing holds the markers in plaintext."""
    import shutil
    import subprocess

    from cronbox.outbox.queue.models import DONE
    from sqlalchemy.engine import make_url
    from tests.conftest import run_cli
    import tests.handlers.sealed_clinic  # noqa: F401  (declares the sealed type in this process too)

    phone, text_marker = "+15550199887766", "PHI-MARKER biopsy results ready for Jane Roe"
    with runtime.sessions.begin() as session:
        cronbox.record(session, "sealed_clinic.result_ready", {"phone": phone, "text": text_marker})
    child = {**env, "CRONBOX_HANDLERS": "tests.handlers.sealed_clinic", "CRONBOX_SMS_DRIVER": "test"}
    ran = run_cli(child, "tick", "--no-linger", "--max-time", "60")
    assert ran.returncode == 0, ran.stderr
    statuses = {r.handler: r.status for r in jobs_of(runtime)}
    assert statuses == {"cronbox.sms": DONE, "sealed_clinic.file_result": DONE}, (statuses, ran.stderr)
    with runtime.sessions.begin() as session:  # the control: a plaintext payload the grep must find
        cronbox.record(session, "unsealed.control", {"text": "CONTROL-MARKER"}, sealed=None)
    url = make_url(database.url)
    dump = subprocess.run([shutil.which("mariadb-dump") or "mysqldump", "-h", url.host or "127.0.0.1",
                           "-P", str(url.port or 3306), "-u", url.username or "root", "--skip-ssl", url.database],
                          capture_output=True, text=True, timeout=120)
    assert dump.returncode == 0 and "CONTROL-MARKER" in dump.stdout, dump.stderr
    places = {"mysqldump": dump.stdout, "tick output": ran.stdout + ran.stderr}
    for path in settings.instance.rglob("*"):
        if path.is_file():
            places[str(path)] = path.read_bytes().decode("utf-8", "replace")
    for marker in (phone, "PHI-MARKER", "Jane Roe", phone[-8:]):
        found = [where for where, content in places.items() if marker in content]
        assert found == [], f"{marker!r} in plaintext in {found}"


@pytest.mark.backends("sqlite", "mysql-skip-locked")
def test_a_sealed_type_is_forwarded_sealed_and_amqp_consume_with_the_same_keys_opens_it(runtime, registry,
                                                                                          sealer, rabbit):
    from cronbox.outbox.events.incoming import BadMessage, parse

    kind = f"clinic.result.{secrets.token_hex(3)}"
    exchange = rabbit.exchange()
    sealed_queue, open_queue = rabbit.queue(exchange, kind, "sealed"), rabbit.queue(exchange, kind, "other")
    cronbox.forward(kind, exchange=exchange, name=f"sealed-{kind}", routing_key=lambda e: f"{e.type}",
                   registry=registry)

    @consumer(kind, name=f"remote-{kind}", sealed=True, runs="broker", registry=registry)
    def remote(event, ctx):
        pass

    with runtime.sessions.begin() as session:
        cronbox.record(session, kind, {"text": MARKER})
    runtime.settings.raw["CRONBOX_AMQP_URL"] = rabbit.url
    relay(runtime)
    [message] = rabbit.take(sealed_queue)
    assert len(rabbit.take(open_queue)) == 1  # bound to the same key: the same sealed message
    body = message.body if isinstance(message.body, str) else message.body.decode()
    assert MARKER not in body and body.startswith("cbxp1:")
    headers = message.properties["application_headers"]
    assert len(headers["x-cronbox-sealed"]) == 32 and len(headers["x-cronbox-install"]) == 32
    assert parse(message, registry.consumers, runtime).event.payload == {"text": MARKER}
    with sealing.using(None):
        bare = type("NoVault", (), {"sealer": staticmethod(lambda: None)})()
        with pytest.raises(BadMessage, match="no key vault"):
            parse(message, registry.consumers, bare)
    headers["x-cronbox-sealed"] = "0" * 32  # another row's seal id
    with pytest.raises(BadMessage, match="does not open"):
        parse(message, registry.consumers, runtime)


from tests.rabbit import amqp_vhost, rabbit  # noqa: E402,F401  (the RabbitMQ fixtures)


@pytest.mark.backends("sqlite", "mysql-token", "postgresql")
def test_the_pool_opens_sealed_jobs_in_its_children(runtime, settings, env):
    """`queue work --workers 2`: forked children open what the test's process sealed, under the same keys."""
    from tests.conftest import run_cli
    from tests.handlers.sealed_clinic import file_result

    for n in range(6):
        dispatch(runtime, file_result, {"note": f"PHI-MARKER {n}"})
    ran = run_cli({**env, "CRONBOX_HANDLERS": "tests.handlers.sealed_clinic"}, "queue", "work", "--queue", "clinic",
                  "--workers", "2", "--stop-when-empty", "--max-time", "60")
    assert ran.returncode == 0, ran.stderr
    assert [r.status for r in jobs_of(runtime)] == ["done"] * 6, ran.stderr


# ---- a unique job's default key, re-keyed with its payload (seal-payloads, rewrap) ---------------------

UNIQUE = "cronbox-test.unique"


def _unique_jobs(registry, seen=None):
    """The same unique job twice: as declared before sealing was turned on (another registry: dispatching
    only, as an app's older release did) and sealed, as declared now (the runtime's: the worker runs it)."""
    from cronbox.outbox.engine.registry import Registry

    @job("sms", name=UNIQUE, unique=True, registry=Registry())
    def plain(payload, ctx):
        raise AssertionError("the worker runs the sealed declaration")

    @job("sms", name=UNIQUE, unique=True, sealed=True, registry=registry)
    def sealed(payload, ctx):
        if seen is not None:
            seen.append(payload)

    return plain, sealed


def _bare_hash(payload) -> str:
    import hashlib

    from cronbox.outbox.core.payload import dump_payload

    return hashlib.sha256(dump_payload(payload).encode()).hexdigest()


def every_column(rt) -> str:
    """Every column of every job row, as text: where a bare hash of a payload must not be."""
    with rt.sessions() as session:
        rows = session.execute(text("SELECT * FROM cronbox_jobs")).all()
    return "\n".join(" ".join(str(value) for value in row) for row in rows)


def _row(rt, job_id) -> Job:
    return next(r for r in jobs_of(rt) if r.id == job_id)


def test_seal_payloads_rekeys_a_unique_jobs_default_key_so_a_sealed_dispatch_is_refused_as_a_duplicate(
        runtime, registry, sealer):
    """Dispatched plain (its default unique key a bare SHA-256 of the patient's phone and text), sealed by
    `storage seal-payloads`: the row then holds the keyed fingerprint a sealed dispatch computes, so that
    dispatch is refused while it waits, and no bare hash of the payload is left in any column. A key the
    caller gave is not derived from the payload: it stays as it was, and still refuses its duplicate."""
    from cronbox.outbox.queue.jobs import default_unique_key
    from cronbox.outbox.core.payload import dump_payload
    from cronbox.storage import payload_maintenance

    seen: list = []
    plain, sealed = _unique_jobs(registry, seen)
    payload, explicit = {"to": "+15550100", "text": MARKER}, {"to": "+15550101", "text": MARKER}
    first = dispatch(runtime, plain, payload)
    with runtime.sessions.begin() as session:
        given = plain.dispatch(session, explicit, unique_key="appointment-1842")
    assert _row(runtime, first).unique_key == f"{UNIQUE}:{_bare_hash(payload)}"  # the gap: a guessable hash

    result = payload_maintenance.seal_plaintext(runtime.sessions, sealer, jobs={UNIQUE}, event_types=set())
    assert (result.done, result.failed, result.rekeyed, result.stopped, result.duplicates) == (2, [], 1, 0, [])
    row = _row(runtime, first)
    assert row.payload.startswith("cbxp1:") and MARKER not in row.payload
    assert row.unique_key == default_unique_key(UNIQUE, dump_payload(payload), sealer)
    assert _row(runtime, given).unique_key == f"{UNIQUE}:appointment-1842"  # the caller's: untouched
    stored = every_column(runtime)
    assert _bare_hash(payload) not in stored and MARKER not in stored

    assert dispatch(runtime, sealed, payload) is None  # a duplicate of the waiting job, as dispatch says
    with runtime.sessions.begin() as session:
        assert sealed.dispatch(session, {"other": 1}, unique_key="appointment-1842") is None
    assert len(jobs_of(runtime)) == 2
    again = payload_maintenance.seal_plaintext(runtime.sessions, sealer, jobs={UNIQUE}, event_types=set())
    assert (again.done, again.rekeyed) == (0, 0)  # resumable: the sealed unique rows are read, none changed
    work(runtime, ["sms"])
    assert sorted(p["to"] for p in seen) == ["+15550100", "+15550101"]  # each once


def test_seal_payloads_rekeys_a_bare_hash_an_earlier_run_left_on_a_sealed_row(runtime, registry, sealer):
    """A row an earlier seal-payloads sealed kept its bare-hash key: a later run opens it (in memory) to
    recognise the key, and re-keys it alone; the payload, sealed already, is not written again."""
    from cronbox.storage import payload_maintenance

    plain, sealed = _unique_jobs(registry)
    payload = {"to": "+15550100", "text": MARKER}
    job_id = dispatch(runtime, sealed, payload)
    envelope = _row(runtime, job_id).payload
    with runtime.engine.begin() as connection:  # as that earlier run left it
        connection.execute(update(Job).where(Job.id == job_id).values(unique_key=f"{UNIQUE}:{_bare_hash(payload)}"))
    result = payload_maintenance.seal_plaintext(runtime.sessions, sealer, jobs={UNIQUE}, event_types=set())
    assert (result.done, result.rekeyed, result.failed) == (0, 1, [])
    assert _row(runtime, job_id).payload == envelope and _bare_hash(payload) not in every_column(runtime)
    assert dispatch(runtime, sealed, payload) is None


def test_seal_payloads_fails_the_later_of_two_waiting_duplicates_and_runs_the_job_once(runtime, registry, sealer):
    """Two waiting jobs of one unique job and payload, admitted only because their keys differed (one
    dispatched plain, one sealed after sealing was turned on): sealing the plain one makes its key the other's.
    One is failed as DuplicateJob, never deleted: the later dispatched (the one dispatch would have
    refused), else, when that one is running, the row being sealed; the other keeps or takes the key.
    Neither can be stopped (the row a batch member, the other running): both run, and the row loses its
    default key (the other holds the keyed one)."""
    from cronbox.outbox.core.payload import dump_payload
    from cronbox.outbox.queue.jobs import default_unique_key
    from cronbox.storage import payload_maintenance

    seen: list = []
    plain, sealed = _unique_jobs(registry, seen)
    p, q, r = ({"to": f"+1555010{n}", "text": MARKER} for n in range(3))
    a = dispatch(runtime, plain, p)
    c = dispatch(runtime, plain, q)
    with runtime.sessions.begin() as session:
        e = plain.dispatch(session, r, batch=cronbox.batch(session, name="reminders"))
    b, d, f = (dispatch(runtime, sealed, payload) for payload in (p, q, r))
    assert None not in (b, d, f)  # the gap: the sealed dispatches missed the waiting plain ones
    with runtime.engine.begin() as connection:  # d and f are running
        connection.execute(update(Job).where(Job.id.in_((d, f))).values(status="reserved", claim_token="t" * 32))

    result = payload_maintenance.seal_plaintext(runtime.sessions, sealer, jobs={UNIQUE}, event_types=set())
    assert (result.done, result.failed, result.rekeyed, result.stopped) == (3, [], 1, 2)
    assert [job_id for job_id, _ in result.duplicates] == [f"job {b}", f"job {c}", f"job {e}"]
    assert "failed as DuplicateJob" in dict(result.duplicates)[f"job {b}"]
    assert "both run" in dict(result.duplicates)[f"job {e}"]
    rows = {row.id: row for row in jobs_of(runtime)}
    assert rows[a].status == "ready" and rows[a].unique_key == default_unique_key(UNIQUE, dump_payload(p), sealer)
    for stopped, kept in ((b, a), (c, d)):
        assert rows[stopped].status == FAILED and rows[stopped].error_class == "DuplicateJob"
        assert rows[stopped].unique_key is None and f"job {kept}" in rows[stopped].last_error
        assert MARKER not in rows[stopped].last_error
    assert rows[d].status == "reserved" and rows[d].unique_key == default_unique_key(UNIQUE, dump_payload(q), sealer)
    assert rows[e].status == "ready" and rows[e].unique_key is None and rows[f].unique_key is not None
    assert all(row.payload.startswith("cbxp1:") for row in rows.values())
    stored = every_column(runtime)
    assert MARKER not in stored and not [x for x in (p, q, r) if _bare_hash(x) in stored]
    assert dispatch(runtime, sealed, p) is None and dispatch(runtime, sealed, q) is None

    with runtime.engine.begin() as connection:  # the running ones' worker died: due again
        connection.execute(update(Job).where(Job.id.in_((d, f))).values(status="ready", claim_token=None))
    work(runtime, ["sms"])
    assert sorted(x["to"] for x in seen) == ["+15550100", "+15550101", "+15550102", "+15550102"]  # r: both ran


def test_rewrap_rekeys_a_unique_jobs_fingerprint_under_the_new_key(runtime, registry, sealer, settings):
    """The fingerprint is keyed by the active master key: after `storage new-key` a sealed dispatch of a
    waiting job's payload computes another key and was admitted. `storage rewrap` re-keys the waiting
    job's default key with its payload, fails a duplicate admitted meanwhile (the later one), and leaves a
    key the caller gave as it was."""
    from cronbox.outbox.core.payload import dump_payload
    from cronbox.outbox.queue.jobs import default_unique_key
    from cronbox.storage import payload_maintenance

    plain, sealed = _unique_jobs(registry)
    p, q = {"to": "+15550100", "text": MARKER}, {"to": "+15550101", "text": MARKER}
    a, c = dispatch(runtime, sealed, p), dispatch(runtime, sealed, q)
    with runtime.sessions.begin() as session:
        given = sealed.dispatch(session, {"n": 1}, unique_key="appointment-1842")
    keys.new_key(settings, keys.ENCRYPTION)
    fresh = sealer_of(settings)
    runtime.sealer_source = lambda: fresh
    with sealing.using(fresh):
        d = dispatch(runtime, sealed, q)
        assert d is not None  # the gap: its fingerprint under the new key is not c's
        result = payload_maintenance.rewrap(runtime.sessions, fresh)
        assert (result.done, result.failed, result.rekeyed, result.stopped) == (3, [], 2, 1)
        assert result.duplicates[0][0] == f"job {d}"
        rows = {row.id: row for row in jobs_of(runtime)}
        assert rows[a].unique_key == default_unique_key(UNIQUE, dump_payload(p), fresh)
        assert rows[c].unique_key == default_unique_key(UNIQUE, dump_payload(q), fresh)
        assert rows[d].status == FAILED and rows[d].error_class == "DuplicateJob" and rows[d].unique_key is None
        assert rows[given].unique_key == f"{UNIQUE}:appointment-1842"
        assert dispatch(runtime, sealed, p) is None and dispatch(runtime, sealed, q) is None
        assert payload_maintenance.rewrap(runtime.sessions, fresh).done == 0


@pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")
def test_the_commands_report_unique_keys_re_keyed_and_the_duplicates_they_failed(runtime, registry, sealer, settings,
                                                                                  env):
    from tests.conftest import run_cli

    plain, sealed = _unique_jobs(registry)
    payload = {"to": "+15550100", "text": MARKER}
    a = dispatch(runtime, plain, payload)
    b = dispatch(runtime, sealed, payload)  # admitted: its keyed fingerprint is not a's bare hash
    done = run_cli(env, "storage", "seal-payloads", "--all")
    assert done.returncode == 0, done.stderr
    assert ("seal-payloads: 1 payloads sealed, 0 failed; 1 unique keys re-keyed, 1 duplicate jobs failed as "
            "DuplicateJob") in done.stdout, done.stdout
    assert f"  job {b}: a duplicate of job {a}: failed as DuplicateJob (`queue retry {b}` runs it anyway)" \
        in done.stdout, done.stdout
    assert MARKER not in done.stdout + done.stderr and _bare_hash(payload) not in done.stdout
    failed = run_cli(env, "queue", "failed")
    assert failed.returncode == 0 and "DuplicateJob" in failed.stdout, failed.stdout + failed.stderr
    keys.new_key(settings, keys.ENCRYPTION)
    rewrapped = run_cli(env, "storage", "rewrap")
    assert rewrapped.returncode == 0, rewrapped.stderr
    assert ("2 sealed payloads re-sealed, 0 failed; 1 unique keys re-keyed, 0 duplicate jobs failed as "
            "DuplicateJob") in rewrapped.stdout, rewrapped.stdout  # a's (re-keyed) and the failed b's
    fresh = sealer_of(settings)
    runtime.sealer_source = lambda: fresh
    with sealing.using(fresh):
        assert dispatch(runtime, sealed, payload) is None
