"""The key vault's side of sealed payloads (outbox.core.sealing): master keys for the outbox's sealer.

The outbox layer never imports storage; this module gives it what it needs, the active master key
and any key by id, read from the same key folder as the files' (`storage new-key` rotates both;
`payloads rewrap` re-seals waiting rows under the new key). The payload key itself is derived in
outbox.core.sealing (HKDF, its own info): never a file's data key.

A sealer needs the settings only (the key folder): never the app's Storage, its runtime or a
connection of its own. record() and dispatch() find it inside the caller's transaction, where a
second connection (a schema check, SQLite's second writer) would wait on that very transaction.
The key folder is read on the first seal or open, not before: a process that seals nothing never
loads `keys` (and with it libsodium).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.sealing import MissingPayloadKey, PayloadIntegrityError, Sealer, VaultUnusable
from cronbox.outbox.core.settings import Settings

from .errors import IntegrityError, KeyFolderError, UnknownKey

if TYPE_CHECKING:
    from .keys import KeyRing

log = logging.getLogger("cronbox")

# How long a key ring read is trusted before the key folder is looked at again (one scandir): a
# record() pays no system call, and a key added by `storage new-key` is used within this time.
RECHECK_SECONDS = 1.0


class VaultPayloadKeys:
    """PayloadKeys over the key folder of `settings` (generated on first use, as the files' are)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._ring: KeyRing | None = None
        self._read_at = 0.0

    def _keyring(self, *, fresh: bool = False) -> KeyRing:
        from . import keys  # here: libsodium loads with the first sealed payload, not with a plain tick

        now = time.monotonic()
        if fresh or self._ring is None or now - self._read_at > RECHECK_SECONDS:
            if self._ring is None or keys.folder_stamp(self.settings) != self._ring.stamp:
                try:
                    self._ring = keys.load(self.settings)
                except KeyFolderError as exc:
                    raise VaultUnusable(str(exc)) from None
            self._read_at = now
        return self._ring

    def active(self) -> tuple[str, bytes]:
        key = self._keyring().active
        return key.id, key.material

    def material(self, key_id: str) -> bytes:
        try:
            return self._keyring().master_key(key_id)
        except UnknownKey:
            try:  # a key restored a moment ago: look at the folder once more before saying it is missing
                return self._keyring(fresh=True).master_key(key_id)
            except UnknownKey:
                raise MissingPayloadKey(key_id) from None
        except IntegrityError as exc:
            raise PayloadIntegrityError(f"sealed payload: {exc}") from None

    def known(self) -> set[str]:
        """Ids of the master keys in the folder (health: a waiting payload's key missing)."""
        return set(self._keyring(fresh=True).encryption)


def sealer_of(settings: Settings) -> Sealer:
    """The payload sealer of the key folder `settings` name. Its owner keeps it (one per app:
    cronbox.web.state; one per standalone store: cronbox.storage): it caches the database's install
    id and the derived keys."""
    return Sealer(VaultPayloadKeys(settings), seal_all=settings.seal_payloads == "all")


def vault_problem(settings: Settings) -> str | None:
    """Why the key folder of `settings` cannot seal payloads (unsafe, unreadable, inside a web root),
    or None when it can (one that does not exist yet is made on first use). Start-up and health ask."""
    from . import keys

    try:
        keys.check_key_folder(settings)
    except KeyFolderError as exc:
        return str(exc)
    return None


def check_vault(settings: Settings, *, warn: bool) -> None:
    """Start-up's look at the key vault (Cronbox.init_app with warn=True; a standalone cron command with
    warn=False, which pays for it only under CRONBOX_SEAL_PAYLOADS=all). CRONBOX_SEAL_PAYLOADS=all with a
    key folder that cannot be used: SettingsError, one line. Otherwise, with `warn`, that key folder is
    said once in the log: the payloads sealed by default (the channel jobs) are stored unsealed until it
    is fixed, and health says so too."""
    if settings.seal_payloads != "all" and not warn:
        return
    problem = vault_problem(settings)
    if problem is None:
        return
    if settings.seal_payloads == "all":
        raise SettingsError(f"CRONBOX_SEAL_PAYLOADS=all, but the key vault is not usable: {problem}")
    log.warning("sealed payloads: the key vault is not usable, so the channel jobs' payloads (PHI) are stored "
                "unsealed and sealed=True ones are refused: %s", problem)


def unsealed_by_default(session, names: set[str]) -> int:
    """How many payloads of jobs sealed by default (`names`) wait, run or failed unsealed: dispatched where
    no key vault was usable, or before the upgrade that sealed them (health)."""
    from sqlalchemy import func, select

    from cronbox.outbox.queue.models import Job

    if not names:
        return 0
    return session.scalar(select(func.count()).select_from(Job).where(
        Job.handler.in_(sorted(names)), Job.seal_id.is_(None), Job.status.in_(("ready", "reserved", "failed"))))


def waiting_key_ids(session) -> set[str]:
    """Master key ids of sealed payloads that may still run: jobs ready, reserved or failed, events not
    fanned out or with a pending or dead delivery, results not expired (health: a missing key said
    before a worker, or a reader of a result, fails on it)."""
    from sqlalchemy import func, or_, select

    from cronbox.outbox.core import clock
    from cronbox.outbox.core.sealing import PREFIX
    from cronbox.outbox.events.models import Delivery, OutboxEvent
    from cronbox.outbox.queue.models import Job, JobResult

    start, width = len(PREFIX) + 1, 23  # the key id and its ":" (ids are 17 to 22 characters)
    jobs = select(func.substr(Job.payload, start, width)).where(
        Job.seal_id.is_not(None), Job.status.in_(("ready", "reserved", "failed"))).distinct()
    events = select(func.substr(OutboxEvent.payload, start, width)).where(
        OutboxEvent.seal_id.is_not(None),
        or_(OutboxEvent.fanned_out_at.is_(None),
            OutboxEvent.id.in_(select(Delivery.event_id).where(Delivery.status.in_(("pending", "dead")))))).distinct()
    kept = select(func.substr(JobResult.value, start, width)).where(
        JobResult.value.startswith(PREFIX, autoescape=True), JobResult.expires_at > clock.utcnow()).distinct()
    found = set(session.scalars(jobs)) | set(session.scalars(events)) | set(session.scalars(kept))
    return {text.split(":", 1)[0] for text in found if text}
