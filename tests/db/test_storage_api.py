"""storage's Python API on every backend: put, grants and uses, tampering with rows and files, keys, rewrap, sweep."""
from __future__ import annotations

import io
import os
import stat
import threading
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, text, update

from cronbox.outbox.core import clock
from cronbox.outbox.core.engines import make_engine, session_factory
from cronbox.outbox.core.transactions import in_transaction
from cronbox import storage
from cronbox.storage import grants, keys, maintenance
from cronbox.storage.errors import GrantInvalid, IntegrityError, NotFound, StorageError, UnknownKey
from cronbox.storage.format import CHUNK_SIZE
from cronbox.storage.models import AuditEntry, Grant, GrantUse, SealedFile
from tests.conftest import ONE_MYSQL_MODE, run_cli
from tests.storage_helpers import files_under, flip_byte, grant, put, read, row, sealed_path, store  # noqa: F401

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode changes nothing these tests check

NAME = "Jane Doe – HIV result.pdf"


def test_put_writes_through_the_callers_session_and_never_commits(store):
    with store.sessions() as session:
        file_id = storage.put(session, io.BytesIO(b"x" * 1000), filename=NAME, content_type="application/pdf",
                              owner="patient:1")
        assert session.get(SealedFile, file_id) is not None  # in the caller's session
        session.rollback()
    assert row(store, file_id) is None
    assert sealed_path(store, file_id).exists()  # an orphan until sweep: harmless, sealed
    assert maintenance.sweep(store, grace=3600).orphans == 0  # too young
    assert maintenance.sweep(store, grace=0).orphans == 1
    assert not sealed_path(store, file_id).exists()


@pytest.mark.parametrize("field", ["filename", "content_type", "owner"])
def test_text_that_is_not_utf8_is_refused_before_anything_is_written(store, field):
    """os.fsdecode's lone surrogates in a name, type or owner: one StorageError, no row, no file on disk
    (they reached the sealed metadata's encoder or the driver before, with an error of their own)."""
    args = {"filename": NAME, "content_type": "application/pdf", "owner": "patient:1"}
    args[field] = "scan\udcff"
    with store.sessions() as session:
        with pytest.raises(StorageError, match="UTF-8"):
            storage.put(session, io.BytesIO(b"x" * 100), **args)
        assert not session.new
    assert not store.settings.sealed_dir.exists() or list(files_under(store.settings.sealed_dir)) == []
    file_id = put(store, b"data")
    with pytest.raises(StorageError, match="UTF-8"):
        in_transaction(store.sessions, lambda s: store.grant(s, file_id, "staff\udcff"))


def test_put_then_read_back(store):
    data = os.urandom(3 * CHUNK_SIZE + 5)
    file_id = put(store, data, name=NAME)
    assert read(store, file_id) == data
    record = row(store, file_id)
    assert record.size == len(data) and record.owner == "patient:1"
    assert store.describe(record) == (NAME, "application/pdf")
    assert record.sealed_size == sealed_path(store, file_id).stat().st_size


def test_permissions_and_layout(store):
    file_id = put(store, b"abc")
    path = sealed_path(store, file_id)
    assert path.parent.parent == store.settings.sealed_dir and path.parent.name == file_id[:2]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.settings.sealed_dir.stat().st_mode) == 0o700
    folder = store.settings.key_folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())


def test_names_and_types_are_never_stored_in_clear(store, runtime):
    file_id = put(store, b"%PDF-1.7 results", name=NAME, content_type="application/x-very-telling")
    g = grant(store, file_id)
    store.signed_url(g)
    with runtime.engine.connect() as connection:
        dump = repr([connection.execute(text(f"SELECT * FROM {t}")).all()
                     for t in ("cronbox_files", "cronbox_grants", "cronbox_file_audit")])
    assert "Jane" not in dump and "telling" not in dump and "HIV" not in dump
    raw = sealed_path(store, file_id).read_bytes()
    assert b"Jane" not in raw and b"PDF" not in raw


def _swap(path_a, path_b):
    temporary = path_a.with_suffix(".swap")
    path_a.rename(temporary)
    path_b.rename(path_a)
    temporary.rename(path_b)


def test_two_files_swapped_between_records_are_detected(store):
    a, b = put(store, b"patient A " * 10000), put(store, b"patient B " * 10000)
    _swap(sealed_path(store, a), sealed_path(store, b))
    for file_id in (a, b):
        with pytest.raises(IntegrityError, match="another record"):
            read(store, file_id)
        assert "another record" in store.verify(row(store, file_id))


def test_wrapped_keys_swapped_between_rows_are_detected(store):
    a, b = put(store, b"A"), put(store, b"B")
    ra, rb = row(store, a), row(store, b)
    in_transaction(store.sessions, lambda s: (
        s.execute(update(SealedFile).where(SealedFile.id == a).values(wrapped_key=rb.wrapped_key)),
        s.execute(update(SealedFile).where(SealedFile.id == b).values(wrapped_key=ra.wrapped_key))))
    for file_id in (a, b):
        with pytest.raises(IntegrityError, match="wrapped key"):
            read(store, file_id)


def test_any_bit_flipped_in_a_stored_wrapped_key_or_metadata(store):
    file_id = put(store, b"data")
    original = row(store, file_id)
    for column, value in (("wrapped_key", original.wrapped_key), ("meta", original.meta)):
        for byte in (0, len(value) // 2, len(value) - 1):
            tampered = bytearray(value)
            tampered[byte] ^= 0x01
            in_transaction(store.sessions, lambda s: s.execute(
                update(SealedFile).where(SealedFile.id == file_id).values({column: bytes(tampered)})))
            with pytest.raises(IntegrityError):
                read(store, file_id)
        in_transaction(store.sessions, lambda s: s.execute(
            update(SealedFile).where(SealedFile.id == file_id).values({column: value})))
    assert read(store, file_id) == b"data"


def test_unknown_key_id_and_wrong_key(store):
    file_id = put(store, b"data")
    good = row(store, file_id)
    in_transaction(store.sessions, lambda s: s.execute(
        update(SealedFile).where(SealedFile.id == file_id).values(key_id="enc-0099-deadbeef")))
    with pytest.raises(UnknownKey, match="enc-0099-deadbeef"):
        read(store, file_id)
    in_transaction(store.sessions, lambda s: s.execute(
        update(SealedFile).where(SealedFile.id == file_id).values(key_id=good.key_id)))
    key_file = store.settings.key_folder / f"{good.key_id}.key"
    key_file.write_text("A" * 43 + "\n")  # same id, other material
    with pytest.raises(IntegrityError, match="does not open with master key"):
        read(store, file_id)


def test_a_corrupt_chunk_is_reported_by_verify_and_recorded(store):
    data = os.urandom(4 * CHUNK_SIZE)
    file_id = put(store, data)
    flip_byte(store, file_id, len(data), chunk=2, offset=10, mask=0xFF)
    failures, unknown = maintenance.verify(store, None, report=lambda *_: None)
    assert (failures, unknown) == (1, [])
    [bad] = maintenance.recorded_errors(store)
    assert bad.id == file_id and "chunk 2" in bad.integrity_error
    flip_byte(store, file_id, len(data), chunk=2, offset=10, mask=0xFF)  # restored from a backup
    assert maintenance.verify(store, [file_id], report=lambda *_: None) == (0, [])
    assert maintenance.recorded_errors(store) == []


def test_missing_file_is_an_integrity_error(store):
    file_id = put(store, b"data")
    sealed_path(store, file_id).unlink()
    assert "missing" in store.verify(row(store, file_id))


# --- grants and uses -----------------------------------------------------------------------------

def test_an_absolute_link_needs_the_base_url_and_issues_nothing_without_it(store, runtime):
    g = grant(store, put(store, b"data"))

    def issued() -> int:
        return len(in_transaction(store.sessions, lambda s: s.scalars(
            select(AuditEntry).where(AuditEntry.action == "issue")).all()))

    for call in (lambda: store.signed_url(g, 60, absolute=True), lambda: storage.signed_url(g, absolute=True)):
        with pytest.raises(storage.BaseUrlMissing, match="needs CRONBOX_BASE_URL"):
            call()
    assert issued() == 0  # refused before a token was made or audited
    with pytest.raises(NotFound):  # with the setting, the grant is checked as for a relative link
        storage.Storage(replace(store.settings, base_url="https://x.example"), store.sessions).signed_url(
            "f" * 32, absolute=True)
    based = storage.Storage(replace(store.settings, base_url="https://clinic.example/app"), store.sessions)
    link = based.signed_url(g, 60, absolute=True)
    assert link.startswith("https://clinic.example/app/files/") and link.count("/files/") == 1
    assert based.signed_url(g, 60).startswith("/files/")  # relative unless asked
    assert issued() == 2


def test_grant_validation_and_signed_url_refusals(store):
    file_id = put(store, b"data")
    with pytest.raises(NotFound):
        grant(store, "0" * 32)
    with pytest.raises(NotFound):
        grant(store, "../../etc/passwd")
    with pytest.raises(StorageError):
        grant(store, file_id, expires_in=0)
    with pytest.raises(StorageError):
        grant(store, file_id, max_uses=0)
    g = grant(store, file_id, expires_in=60)
    assert store.signed_url(g, 300).startswith("/files/")
    for ttl in (0, store.settings.url_max_ttl + 1, 1.5):
        with pytest.raises(StorageError):
            store.signed_url(g, ttl)
    with pytest.raises(NotFound):
        store.signed_url("f" * 32)
    in_transaction(store.sessions, lambda s: store.revoke(s, g))
    assert in_transaction(store.sessions, lambda s: store.revoke(s, g)) is False
    with pytest.raises(GrantInvalid, match="revoked"):
        store.signed_url(g)
    with clock.frozen(clock.utcnow() - timedelta(seconds=300)):
        expired = grant(store, file_id, expires_in=60)
    with pytest.raises(GrantInvalid, match="grant-expired"):
        store.signed_url(expired)


def _count(store, grant_id, jti):
    return in_transaction(store.sessions, lambda s: grants.count_use(s, grant_id, jti, clock.utcnow()))


def test_uses_are_counted_per_token_id_with_a_same_use_window(store):
    file_id = put(store, b"data")
    with clock.frozen(datetime(2026, 1, 1, 12, 0)):
        g = grant(store, file_id, max_uses=2, expires_in=86400)
        assert _count(store, g, "jti-a") is True
        assert _count(store, g, "jti-a") is False  # a range re-request: same use
        clock.advance(grants.SAME_USE_WINDOW - 1)
        assert _count(store, g, "jti-a") is False
        clock.advance(grants.SAME_USE_WINDOW + 1)
        assert _count(store, g, "jti-a") is True  # a new use of the same link, later
        with pytest.raises(GrantInvalid, match="exhausted"):
            _count(store, g, "jti-b")
        assert _count(store, g, "jti-a") is False  # still the current use: allowed although exhausted
        with store.sessions() as session:
            assert session.get(Grant, g).uses == 2
            assert session.get(GrantUse, (g, "jti-b")) is None  # the refused use left no row
        in_transaction(store.sessions, lambda s: store.revoke(s, g))
        with pytest.raises(GrantInvalid, match="revoked"):
            _count(store, g, "jti-a")


def test_concurrent_first_uses_never_exceed_max_uses(store, settings):
    """Eight requests with different tokens race for three uses: exactly three win."""
    file_id = put(store, b"data")
    g = grant(store, file_id, max_uses=3)
    engine = make_engine(settings, role="web")
    sessions = session_factory(engine)
    barrier = threading.Barrier(8)
    outcomes = []

    def attempt(n):
        barrier.wait()
        try:
            outcomes.append(in_transaction(sessions, lambda s: grants.count_use(s, g, f"jti-{n}", clock.utcnow()),
                                           retries=50))
        except GrantInvalid:
            outcomes.append("refused")

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.dispose()
    assert sorted(map(str, outcomes)) == ["True"] * 3 + ["refused"] * 5
    with store.sessions() as session:
        assert session.get(Grant, g).uses == 3


# --- keys and rewrap -----------------------------------------------------------------------------

def test_keys_are_generated_once_and_rotation_adds_an_active_key(store):
    first = store.keyring()
    assert len(first.encryption) == 1 and len(first.signing) == 1
    assert keys.load(store.settings).active.id == first.active.id
    new_id = keys.new_key(store.settings, keys.ENCRYPTION)
    assert store.keyring().active.id == new_id != first.active.id
    signing = keys.new_key(store.settings, keys.SIGNING)
    assert [k.id for k in store.keyring().signing][-1] == signing


def test_rewrap_moves_every_data_key_and_files_open_with_the_new_key_alone(store):
    contents = {put(store, os.urandom(n)): None for n in (0, 1, CHUNK_SIZE + 3)}
    contents = {file_id: read(store, file_id) for file_id in contents}
    disk_before = {file_id: sealed_path(store, file_id).read_bytes() for file_id in contents}
    old = store.keyring().active.id
    new = keys.new_key(store.settings, keys.ENCRYPTION)
    result = maintenance.rewrap(store, batch_size=2)
    assert (result.total, result.rewrapped, result.failed) == (3, 3, [])
    (store.settings.key_folder / f"{old}.key").unlink()  # the old master key is gone
    for file_id, data in contents.items():
        assert row(store, file_id).key_id == new
        assert read(store, file_id) == data
        assert sealed_path(store, file_id).read_bytes() == disk_before[file_id]  # no chunk changed
    assert maintenance.rewrap(store).total == 0


def test_rewrap_reports_rows_it_cannot_open_and_goes_on(store):
    good, bad = put(store, b"good"), put(store, b"bad")
    in_transaction(store.sessions, lambda s: s.execute(
        update(SealedFile).where(SealedFile.id == bad).values(key_id="enc-0042-00000000")))
    keys.new_key(store.settings, keys.ENCRYPTION)
    result = maintenance.rewrap(store)
    assert result.rewrapped == 1 and [failed_id for failed_id, _ in result.failed] == [bad]
    assert read(store, good) == b"good"


@pytest.mark.slow
def test_a_rewrap_killed_midway_resumes(store, env):
    data = {put(store, f"file {n}".encode()): f"file {n}".encode() for n in range(5)}
    old = store.keyring().active.id
    new = keys.new_key(store.settings, keys.ENCRYPTION)
    proc = run_cli(env, "storage", "rewrap", "--batch-size", "2", CRONBOX_CRASH_AT="rewrap-batch")
    assert proc.returncode == 86, proc.stderr  # os._exit after the first batch committed
    key_ids = [row(store, file_id).key_id for file_id in sorted(data)]
    assert key_ids.count(new) == 2 and key_ids.count(old) == 3
    proc = run_cli(env, "storage", "rewrap", "--batch-size", "2")
    assert proc.returncode == 0, proc.stderr
    assert "rewrap: done, 3 re-wrapped" in proc.stdout and "2/3" in proc.stdout
    (store.settings.key_folder / f"{old}.key").unlink()
    for file_id, content in data.items():
        assert read(store, file_id) == content


def test_rewrap_is_exclusive(store, runtime, env):
    lock = runtime.lock("rewrap")
    assert lock.acquire()
    try:
        proc = run_cli(env, "storage", "rewrap")
    finally:
        lock.release()
    assert proc.returncode == 0 and proc.stdout.strip() == "skipped: storage rewrap already running"


# --- sweep and retention -------------------------------------------------------------------------

def test_sweep_removes_leftovers_and_expired_rows_but_nothing_live(store):
    live = put(store, b"live")
    orphan = put(store, b"orphan")
    in_transaction(store.sessions, lambda s: s.execute(
        SealedFile.__table__.delete().where(SealedFile.id == orphan)))  # as if its row never committed
    pending = store.vault.create("ab" * 16)
    pending.stream.write(b"half a sealed file")
    old = datetime(2020, 1, 1)
    with clock.frozen(old):
        ended = grant(store, live, expires_in=60)
        in_transaction(store.sessions, lambda s: grants.count_use(s, ended, "j", clock.utcnow()))
        in_transaction(store.sessions, lambda s: s.add(AuditEntry(at=old, action="put", outcome="ok")))
    current = grant(store, live, expires_in=3600)
    result = maintenance.sweep(store, grace=0)
    assert (result.orphans, result.temporary, result.grants) == (1, 1, 1)
    assert result.audit == 2  # the 2020 grant entry and the one added by hand
    assert read(store, live) == b"live"
    with store.sessions() as session:
        assert session.get(Grant, current) is not None and session.get(Grant, ended) is None
        assert session.scalars(select(AuditEntry.at).where(AuditEntry.at < datetime(2021, 1, 1))).all() == []
    assert [p.name for p in files_under(store.settings.sealed_dir)] == [f"{live}.sealed"]
