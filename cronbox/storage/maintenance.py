"""Operator work over many files: verify, rewrap, sweep. Each step is bounded and safe to kill.

All three page through rows by id (keyset pagination, batches of a few
hundred), so memory stays flat whatever the number of files, and each batch is
its own short transaction: a run killed at any point has lost nothing, and the
next run continues where it stopped.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from cronbox.outbox.core import clock
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.settings import Settings
from cronbox.outbox.core.transactions import in_transaction

from . import audit, grants, refusals
from .errors import IntegrityError, UnknownKey
from .models import SealedFile
from .vault import Vault

if TYPE_CHECKING:  # the ciphers (libsodium) load only for verify and rewrap: the tick's hourly sweep needs none
    from .service import Storage

log = logging.getLogger("cronbox")
BATCH = 200
# The shortest grace `storage sweep` accepts. A sealed file is renamed into place when its last byte
# is written, and its row commits right after, in the same request or command: a web upload before
# the web server's request timeout ends it (Apache's `Timeout`, 60 s by default, a few minutes at
# most on cPanel hosts), `storage put` within its database retries (seconds). An hour is far beyond
# those even on a throttled host. It is not a proof: an application that seals with Storage.put()
# inside a transaction it keeps open longer must commit within the hour. A shorter grace could
# delete the file of an upload whose transaction is about to commit (PHI lost after the commit).
MIN_GRACE = 3600


def _page(storage: Storage, after: str, limit: int, *where) -> list[SealedFile]:
    def read(session: Session) -> list[SealedFile]:
        query = select(SealedFile).where(SealedFile.id > after, *where).order_by(SealedFile.id).limit(limit)
        return list(session.scalars(query))

    return in_transaction(storage.sessions, read)


# --- verify --------------------------------------------------------------------------------------

def verify(storage: Storage, file_ids: list[str] | None, *,
           report: Callable[[str, str | None], None]) -> tuple[int, list[str]]:
    """Authenticate every chunk of the given files (None: all) and record each outcome on its row.

    Returns (failures, unknown ids).
    """
    failures, unknown = 0, []

    def check(row: SealedFile) -> None:
        nonlocal failures
        error = storage.verify(row)
        storage.report_integrity(row.id, error)
        failures += error is not None
        report(row.id, error)

    if file_ids is not None:
        for file_id in file_ids:
            rows = _page(storage, "", 1, SealedFile.id == file_id)
            for row in rows:
                check(row)
            if not rows:
                unknown.append(file_id)
        return failures, unknown
    after = ""
    while rows := _page(storage, after, BATCH):
        for row in rows:
            check(row)
        after = rows[-1].id
    return failures, unknown


def recorded_errors(storage: Storage) -> list[SealedFile]:
    """Files whose last check (a download or a verify) found them altered or missing."""
    return in_transaction(storage.sessions, lambda s: list(s.scalars(
        select(SealedFile).where(SealedFile.integrity_error.is_not(None)).order_by(SealedFile.id).limit(1000))))


# --- rewrap --------------------------------------------------------------------------------------

@dataclass
class RewrapResult:
    total: int
    rewrapped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)


def rewrap(storage: Storage, *, batch_size: int = BATCH, before_batch: Callable[[], None] = lambda: None,
           progress: Callable[[RewrapResult], None] = lambda result: None) -> RewrapResult:
    """Re-wrap every data key not under the active master key; no chunk on disk changes.

    Each row is rewritten with `UPDATE … SET key_id, wrapped_key WHERE id = ? AND
    key_id = <old> AND wrapped_key = <old>`: one atomic statement per row, so a
    run killed anywhere leaves each row wholly old or wholly new, and a row
    changed by someone else meanwhile is left alone. Rows whose key is missing
    or does not open are reported and skipped, never blocking the rest.
    """
    from .format import unwrap_key, wrap_key

    active = storage.keyring().active
    pending = (SealedFile.key_id != active.id,)
    result = RewrapResult(total=in_transaction(storage.sessions, lambda s: s.scalar(
        select(func.count()).select_from(SealedFile).where(*pending))))
    after = ""
    while True:
        before_batch()
        rows = _page(storage, after, batch_size, *pending)
        if not rows:
            break

        def work(session: Session) -> tuple[int, list[tuple[str, str]]]:
            done, failed = 0, []
            for row in rows:
                try:
                    file_id = bytes.fromhex(row.id)
                    data_key = unwrap_key(storage.keyring().master_key(row.key_id), row.key_id, file_id,
                                          row.wrapped_key)
                except (UnknownKey, IntegrityError) as exc:
                    failed.append((row.id, str(exc)))
                    continue
                changed = session.execute(
                    update(SealedFile)
                    .where(SealedFile.id == row.id, SealedFile.key_id == row.key_id,
                           SealedFile.wrapped_key == row.wrapped_key)
                    .values(key_id=active.id, wrapped_key=wrap_key(active.material, active.id, file_id, data_key))
                    .execution_options(synchronize_session=False)).rowcount
                done += changed
            audit.record(session, "rewrap", "ok", detail=f"{done} data keys now under {active.id}")
            return done, failed

        done, failed = in_transaction(storage.sessions, work)
        crash_point("rewrap-batch")
        result.rewrapped += done
        result.failed += failed
        after = rows[-1].id
        progress(result)
    if result.rewrapped:
        log.info("storage: rewrap moved %d data keys under %s (%d failed)", result.rewrapped, active.id,
                 len(result.failed))
    return result


# --- sweep ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sweepable:
    """What sweep() reads of a Storage: the tick's hourly task builds this, not a Storage, so it loads
    no keys and no ciphers (a sweep deletes files and rows; it never opens one)."""

    settings: Settings
    sessions: sessionmaker[Session]
    vault: Vault


@dataclass
class SweepResult:
    orphans: int = 0
    temporary: int = 0
    grants: int = 0
    audit: int = 0
    refusals: int = 0  # aggregate entries written for refusals that were only counted


def sweep(storage: Storage | Sweepable, *, grace: float) -> SweepResult:
    """Remove what nothing refers to any more; keep everything else.

    - sealed files with no row, and temporary files, older than `grace` seconds
      (a file is renamed into place before its row is added to the caller's
      transaction: younger files may still be about to commit; the command
      line refuses less than MIN_GRACE);
    - grants that ended over 30 days ago, with their use rows;
    - audit entries older than CRONBOX_AUDIT_RETENTION.
    It also writes the aggregate audit entries of unsigned-token refusals that
    were only counted (storage.refusals), for windows that have ended.
    """
    audit_cutoff = storage.settings.audit_cutoff(clock.utcnow())  # refused below its floor: before any delete
    result = SweepResult()
    cutoff = time.time() - grace
    candidates: list = []

    def flush() -> None:
        ids = [c.file_id for c in candidates]
        known = set(in_transaction(storage.sessions, lambda s: list(
            s.scalars(select(SealedFile.id).where(SealedFile.id.in_(ids))))))
        for leftover in candidates:
            if leftover.file_id not in known:
                leftover.path.unlink(missing_ok=True)
                result.orphans += 1
                log.info("storage: swept orphan sealed file %s (its row never committed)", leftover.file_id)
        candidates.clear()

    for leftover in storage.vault.scan():
        if leftover.mtime > cutoff:
            continue
        if leftover.temporary:
            leftover.path.unlink(missing_ok=True)
            result.temporary += 1
            continue
        candidates.append(leftover)
        if len(candidates) >= BATCH:
            flush()
    if candidates:
        flush()

    now = clock.utcnow()
    while count := in_transaction(storage.sessions, lambda s: refusals.flush(s, now, BATCH)):
        result.refusals += count
    while count := in_transaction(storage.sessions, lambda s: grants.prune(s, now, BATCH)):
        result.grants += count
    while count := in_transaction(storage.sessions, lambda s: audit.prune(s, audit_cutoff, 1000)):
        result.audit += count
    return result
