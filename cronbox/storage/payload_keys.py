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
