"""Key ids (docs/sealed-format.md, "Key files"), apart from the format's ciphers: the key folder is read
(health, the payload sealer's start-up check, `keys`) without loading libsodium or `cryptography`.

A key id is its key file's name without ".key": the kind, the sequence number in 4 to 9 decimal
digits, 8 lowercase hex digits. That is 17 to 22 ASCII characters, within the 32 of the
cronbox_files.key_id column. Only "enc" keys wrap data keys.
"""
from __future__ import annotations

import re

KEY_ID = re.compile(r"(?P<kind>enc|sig)-(?P<sequence>[0-9]{4,9})-[0-9a-f]{8}")
MAX_SEQUENCE = 999_999_999


def is_master_key_id(key_id) -> bool:
    """True for the id of an encryption (master) key: `enc-`, 4 to 9 digits, `-`, 8 lowercase hex digits."""
    match = KEY_ID.fullmatch(key_id) if isinstance(key_id, str) else None
    return match is not None and match["kind"] == "enc"
