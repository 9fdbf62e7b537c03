"""The key vault's side of sealed payloads (outbox.core.sealing): master keys for the outbox's sealer.

The outbox layer never imports storage; this module gives it what it needs, the active master key
and any key by id, read from the same key ring as the files' (`storage new-key` rotates both;
`payloads rewrap` re-seals waiting rows under the new key). The payload key itself is derived in
outbox.core.sealing (HKDF, its own info): never a file's data key.
"""
from __future__ import annotations

import time
from typing import Any

from cronbox.outbox.core.sealing import MissingPayloadKey, PayloadIntegrityError, Sealer

from .errors import IntegrityError, UnknownKey
from .keys import KeyRing

# How long a key ring read is trusted before the key folder is looked at again (one scandir): a
# record() pays no system call, and a key added by `storage new-key` is used within this time.
RECHECK_SECONDS = 1.0


class VaultPayloadKeys:
    """PayloadKeys over a Storage's key ring."""

    def __init__(self, storage: Any):  # a service.Storage (which imports this module)
        self.storage = storage
        self._ring: KeyRing | None = None
        self._read_at = 0.0

    def _keyring(self, *, fresh: bool = False) -> KeyRing:
        now = time.monotonic()
        if fresh or self._ring is None or now - self._read_at > RECHECK_SECONDS:
            self._ring, self._read_at = self.storage.keyring(), now
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


def sealer_of(storage: Any) -> Sealer:
    return Sealer(VaultPayloadKeys(storage), seal_all=storage.settings.seal_payloads == "all")


def waiting_key_ids(session) -> set[str]:
    """Master key ids of sealed payloads that may still run: jobs ready, reserved or failed, events not
    fanned out or with a pending or dead delivery (health: a missing key said before a worker fails)."""
    from sqlalchemy import func, or_, select

    from cronbox.outbox.core.sealing import PREFIX
    from cronbox.outbox.events.models import Delivery, OutboxEvent
    from cronbox.outbox.queue.models import Job

    start, width = len(PREFIX) + 1, 23  # the key id and its ":" (ids are 17 to 22 characters)
    jobs = select(func.substr(Job.payload, start, width)).where(
        Job.seal_id.is_not(None), Job.status.in_(("ready", "reserved", "failed"))).distinct()
    events = select(func.substr(OutboxEvent.payload, start, width)).where(
        OutboxEvent.seal_id.is_not(None),
        or_(OutboxEvent.fanned_out_at.is_(None),
            OutboxEvent.id.in_(select(Delivery.event_id).where(Delivery.status.in_(("pending", "dead")))))).distinct()
    found = set(session.scalars(jobs)) | set(session.scalars(events))
    return {text.split(":", 1)[0] for text in found if text}
