"""Sealed payloads: an event's or job's payload stored as an AES-256-GCM envelope, never as its text.

docs/sealed-format.md ("Sealed payloads") is the specification; this module implements it:

    cbxp1:<key id>:<base64url(nonce || ciphertext || tag)>

Why each part (the spec says it byte by byte):
- The payload key is HKDF-SHA-256 of the vault's master key with an info naming payloads and the
  key id: never the files' data keys, and a key of its own per master key, so rotating the master
  key (`storage new-key`, `payloads rewrap`) rotates payloads too.
- The associated data binds the envelope to its install (a random id the migration stores in the
  database: a payload copied into another database does not open), its table (events or jobs), its
  row (a random `seal_id` written in the same INSERT, in a column outside the payload: ids are
  given only after the INSERT, and sealing must stay one INSERT on the caller's transaction, one
  AEAD call), the key id and the event type or job handler (the one who gets the plaintext).
- A random 96-bit nonce per seal: each seal is one message under a key used for at most a few
  billion payloads between rotations (NIST SP 800-38D's 2^32 bound for random nonces).

The outbox layer holds no key: whoever owns the vault (cronbox.storage) gives a `PayloadKeys` and
a resolver (`set_resolver`) that finds the sealer of the current app, the way storage.current()
finds its store; finding it reads no key and opens no connection (record() and dispatch() ask
inside the caller's transaction). A process where none is set cannot seal: a sealed
record()/dispatch() fails there with one line, before anything is written; a payload sealed only
by default (the channel jobs': BY_DEFAULT) is stored plain there, said once in the log.

`cryptography` is imported in one place, `_crypto()`, on the first payload sealed or opened: a
tick, a worker or a record() with no sealed payload never loads it.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import functools
import hashlib
import hmac
import logging
import os
import re
import struct
import sys
import weakref
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Protocol

from sqlalchemy import select
from sqlalchemy.engine import Connection

from cronbox.outbox.core.errors import CronboxError, PayloadError
from cronbox.outbox.core.payload import load_payload

if TYPE_CHECKING:  # cryptography loads with the first sealed payload (_crypto): a tick with none never pays for it
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = logging.getLogger("cronbox")

PREFIX = "cbxp1:"  # no JSON text starts with "c": a plaintext payload is never taken for an envelope
VERSION = 1
EVENTS, JOBS = "cronbox_events", "cronbox_jobs"
# What else a sealed job seals (docs/sealed-format.md, "Results and chains"), each its own `table` in the
# associated data, so no envelope opens in another's place: a sealed chain step's `flow` (bound to its
# row's seal id and handler, as its payload is) and a sealed job's result (bound to its job id).
FLOWS, RESULTS = "cronbox_jobs.flow", "cronbox_job_results"
NONCE_SIZE, TAG_SIZE, SEAL_ID_SIZE, INSTALL_ID_SIZE = 12, 16, 16, 16
KEY_INFO = b"cronbox-payload/v1 key "
UNIQUE_INFO = b"cronbox-payload/v1 unique "
AD_LABEL = b"cronbox-payload/v1"
# A master key id (docs/sealed-format.md, "Key files"): the envelope's key id is checked against it
# before anything else, so a row cannot point a reader at a path or an unbounded string.
_KEY_ID = re.compile(r"enc-[0-9]{4,9}-[0-9a-f]{8}")
_HEX32 = re.compile(r"[0-9a-f]{32}")

# What a declaration's `sealed` says: True (always; where no key vault is usable the payload is
# refused), False (only under CRONBOX_SEAL_PAYLOADS=all), or BY_DEFAULT, the channel jobs': sealed
# wherever a key vault is configured and usable, stored plain where none is (an app upgraded without
# one keeps sending its SMS; the log says so once per process, and health lists the rows).
BY_DEFAULT: Literal["by-default"] = "by-default"
# Where a process has a key vault (current()): what NoVault and the unsealed warning tell the user.
WHERE_VAULTS = ("use it inside an app context of an app cronbox is set up on, in a cron command, or after "
                "cronbox.storage.configure()")
Sealing = bool | Literal["by-default"]


class SealError(CronboxError):
    """Root of sealed-payload errors: the item fails, its row stays as it is."""


class PayloadIntegrityError(SealError):
    """An envelope that does not open: altered, truncated, or copied from another row, table or database."""


class MissingPayloadKey(SealError):
    """The envelope's master key is not in the key folder (lost, or not copied to this host)."""

    def __init__(self, key_id: str):
        self.key_id = key_id
        super().__init__(f"sealed payload: master key {key_id} is not in the key folder; restore it from your key "
                         "backup (the row is kept)")


class VaultUnusable(SealError):
    """The key folder cannot be used (unsafe, unreadable, inside a web root): the vault's owner says why."""


class NoVault(SealError, PayloadError):
    """A sealed payload where no key vault is configured: refused before anything is written."""

    def __init__(self, what: str):
        super().__init__(f"{what} is sealed, but no key vault is configured in this process: {WHERE_VAULTS}")


class PayloadKeys(Protocol):
    """What a sealer needs of a vault: the active master key and any key by id (the vault's owner,
    cronbox.storage, implements it over its key folder)."""

    def active(self) -> tuple[str, bytes]: ...

    def material(self, key_id: str) -> bytes: ...  # MissingPayloadKey when the folder lacks it


# --- the format (pure functions: keys and bytes in, text or bytes out) -----------------------------

@functools.cache
def _crypto() -> SimpleNamespace:
    """`cryptography`'s public AES-GCM, HKDF and InvalidTag: the one place they are imported, on the
    first payload sealed or opened in this process."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return SimpleNamespace(AESGCM=AESGCM, HKDF=HKDF, SHA256=hashes.SHA256, InvalidTag=InvalidTag)


def hkdf(master: bytes, info: bytes) -> bytes:
    """HKDF-SHA-256 (RFC 5869) through `cryptography`'s public HKDF: no salt (RFC 5869's zeros), 32 bytes."""
    crypto = _crypto()
    return crypto.HKDF(algorithm=crypto.SHA256(), length=32, salt=None, info=info).derive(master)


def aead_of(key: bytes) -> AESGCM:
    """An AES-256-GCM of `key` (a derived payload key)."""
    return _crypto().AESGCM(key)


def derive_key(master: bytes, key_id: str) -> bytes:
    """The payload key of one master key: HKDF-SHA-256(ikm=master, salt=none, info=KEY_INFO || key id)."""
    return hkdf(master, KEY_INFO + key_id.encode("ascii"))


def associated_data(install_id: bytes, table: str, seal_id: bytes, key_id: str, name: str) -> bytes:
    """AD = label || u8(len) install id || u8(len) table || seal id (16) || u8(len) key id || u16be(len) name."""
    table_bytes, key_bytes, name_bytes = table.encode("ascii"), key_id.encode("ascii"), name.encode("utf-8")
    return b"".join((AD_LABEL, bytes([len(install_id)]), install_id, bytes([len(table_bytes)]), table_bytes,
                     seal_id, bytes([len(key_bytes)]), key_bytes, struct.pack(">H", len(name_bytes)), name_bytes))


def is_sealed(text: str | None) -> bool:
    return text is not None and text.startswith(PREFIX)


def envelope_parts(text: str) -> tuple[str, bytes]:
    """(key id, nonce || ciphertext || tag) of an envelope; PayloadIntegrityError for a malformed one."""
    try:
        if not text.startswith(PREFIX):
            raise ValueError(text[:8])
        key_id, body = text[len(PREFIX):].split(":", 1)
    except ValueError:
        raise PayloadIntegrityError("sealed payload: malformed envelope (fields missing)") from None
    if not _KEY_ID.fullmatch(key_id):
        raise PayloadIntegrityError("sealed payload: malformed envelope (not a master key id)")
    if len(body) % 4 == 1 or "=" in body:
        raise PayloadIntegrityError("sealed payload: malformed envelope (not unpadded base64url)")
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise PayloadIntegrityError("sealed payload: malformed envelope (not base64url)") from None
    if _b64(raw) != body:  # one spelling per envelope: no other characters, no non-canonical last digit
        raise PayloadIntegrityError("sealed payload: malformed envelope (not canonical base64url)")
    if len(raw) < NONCE_SIZE + TAG_SIZE:
        raise PayloadIntegrityError("sealed payload: truncated envelope")
    return key_id, raw


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def seal_text(aead: AESGCM, key_id: str, ad: bytes, body: str, *, nonce: bytes | None = None) -> str:
    nonce = nonce if nonce is not None else os.urandom(NONCE_SIZE)
    return f"{PREFIX}{key_id}:{_b64(nonce + aead.encrypt(nonce, body.encode('utf-8'), ad))}"


def open_text(aead: AESGCM, raw: bytes, ad: bytes) -> str:
    try:
        plain = aead.decrypt(raw[:NONCE_SIZE], raw[NONCE_SIZE:], ad)
    except _crypto().InvalidTag:
        raise PayloadIntegrityError("sealed payload does not authenticate (altered, or copied from another row, "
                                    "table or database); the row is kept") from None
    return plain.decode("utf-8")


def describe(text: str | None) -> str:
    """What a person sees of a payload: `sealed (N bytes, key K)` for an envelope, never its text."""
    if not is_sealed(text):
        return f"plaintext ({len(text or '')} characters)"
    assert text is not None
    try:
        key_id, raw = envelope_parts(text)
    except PayloadIntegrityError:
        return f"sealed ({len(text)} characters, malformed)"
    return f"sealed ({len(raw) - NONCE_SIZE - TAG_SIZE} bytes, key {key_id})"


def new_seal_id() -> str:
    return os.urandom(SEAL_ID_SIZE).hex()


def result_seal_id(job_id: int) -> str:
    """The identity a job's result envelope is bound to (RESULTS): its job id, the 16 bytes of a seal id
    as a big-endian unsigned integer. A result row's key is its job id, and it outlives the job's row."""
    return int(job_id).to_bytes(SEAL_ID_SIZE, "big").hex()


# --- the sealer: keys, the install id, sealing and opening ----------------------------------------

class Sealer:
    """Seals and opens payloads under a vault's keys. One per app (its storage's), never per process:
    two apps in one process seal under their own keys. `seal_all`: CRONBOX_SEAL_PAYLOADS=all."""

    def __init__(self, keys: PayloadKeys, *, seal_all: bool = False):
        self.keys = keys
        self.seal_all = seal_all
        self._aeads: dict[tuple[str, bytes], AESGCM] = {}
        self._unique_keys: dict[str, bytes] = {}
        # The install id of each database this sealer has written to or read from, read once per engine.
        self._installs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _aead(self, key_id: str, master: bytes) -> AESGCM:
        aead = self._aeads.get((key_id, master))
        if aead is None:
            aead = self._aeads[(key_id, master)] = aead_of(derive_key(master, key_id))
        return aead

    def install_id(self, connection: Connection) -> bytes:
        engine = connection.engine
        found = self._installs.get(engine)
        if found is None:
            if connection.in_transaction():  # the caller's (record(), dispatch()): one more read in it
                found = read_install_id(connection)
            else:  # a worker's connection between items: a short transaction of its own, ended here
                with connection.begin():
                    found = read_install_id(connection)
            self._installs[engine] = found
        return found

    def fingerprint(self, name: str, body: str, key_id: str | None = None) -> str:
        """A unique job's default key for a sealed payload: HMAC-SHA-256 under a key derived for it,
        never a bare hash (a phone number's SHA-256 is found by trying every number). Derived from the
        active master key, so it changes with `storage new-key`; `key_id`: the fingerprint an older key
        gave (`storage rewrap` recognises a waiting job's default key by it, and re-keys it)."""
        if key_id is None:
            key_id, master = self.keys.active()
            key = self._unique_keys.get(key_id)
        else:
            key = self._unique_keys.get(key_id)
            master = self.keys.material(key_id) if key is None else b""
        if key is None:
            key = self._unique_keys[key_id] = hkdf(master, UNIQUE_INFO + key_id.encode("ascii"))
        return hmac.new(key, name.encode("utf-8") + b"\x00" + body.encode("utf-8"), hashlib.sha256).hexdigest()

    def seal(self, connection: Connection, table: str, name: str, body: str) -> tuple[str, str]:
        """(envelope, seal id) of a dumped payload, for the INSERT the caller is about to run."""
        seal_id = new_seal_id()
        return self.seal_with(connection, table, seal_id, name, body), seal_id

    def seal_with(self, connection: Connection, table: str, seal_id: str, name: str, body: str) -> str:
        """The envelope of `body` bound to an identity the row already has: its seal id (a sealed chain
        step's flow, FLOWS), or its job's (a result, RESULTS: result_seal_id)."""
        key_id, master = self.keys.active()
        ad = associated_data(self.install_id(connection), table, bytes.fromhex(seal_id), key_id, name)
        return seal_text(self._aead(key_id, master), key_id, ad, body)

    def open(self, connection: Connection, table: str, name: str, seal_id: str | None, text: str) -> str:
        """The JSON text of an envelope; PayloadIntegrityError, MissingPayloadKey."""
        key_id, raw = envelope_parts(text)
        if seal_id is None or not _HEX32.fullmatch(seal_id):
            raise PayloadIntegrityError("sealed payload: its row has no seal id (the envelope was copied in)")
        ad = associated_data(self.install_id(connection), table, bytes.fromhex(seal_id), key_id, name)
        return open_text(self._aead(key_id, self.keys.material(key_id)), raw, ad)

    def open_message(self, install_hex: str, table: str, name: str, seal_id: str | None, text: str) -> str:
        """The JSON text of an envelope that left its database (a forwarded event's message body): bound to
        the install named by the message's header instead of this process's database."""
        if not isinstance(install_hex, str) or not _HEX32.fullmatch(install_hex):
            raise PayloadIntegrityError("sealed message: no install id header")
        key_id, raw = envelope_parts(text)
        if seal_id is None or not _HEX32.fullmatch(seal_id):
            raise PayloadIntegrityError("sealed message: no seal id header")
        ad = associated_data(bytes.fromhex(install_hex), table, bytes.fromhex(seal_id), key_id, name)
        return open_text(self._aead(key_id, self.keys.material(key_id)), raw, ad)

    def reseal(self, connection: Connection, table: str, name: str, seal_id: str, text: str) -> str | None:
        """The envelope sealed again under the active key (rotation), or None when it already is."""
        active_id, master = self.keys.active()
        if is_sealed(text) and envelope_parts(text)[0] == active_id:
            return None
        body = self.open(connection, table, name, seal_id, text) if is_sealed(text) else text
        ad = associated_data(self.install_id(connection), table, bytes.fromhex(seal_id), active_id, name)
        return seal_text(self._aead(active_id, master), active_id, ad, body)


def read_install_id(connection: Connection) -> bytes:
    from cronbox.outbox.core.install import Install  # the model, loaded with the first sealed payload

    text = connection.execute(select(Install.install_id).where(Install.id == 1)).scalar()
    if text is None or not _HEX32.fullmatch(text):
        raise SealError("this database has no install id (cronbox_install): run `python -m cronbox migrate`")
    return bytes.fromhex(text)


# --- which sealer: the explicit one, else the vault owner's resolver ---------------------------------

_override: contextvars.ContextVar[Sealer | None] = contextvars.ContextVar("cronbox_sealer", default=None)
_resolver: list[Callable[[], Sealer | None]] = []  # set once by the vault's owner: a function, no app state


def set_resolver(resolver: Callable[[], Sealer | None]) -> None:
    """How to find the current app's sealer (cronbox.storage sets it: the app context's app's, else the
    standalone store's). A function holding no state: two apps in one process each get their own."""
    _resolver[:] = [resolver]


@contextlib.contextmanager
def using(sealer: Sealer | None) -> Iterator[None]:
    """Seal and open with `sealer` inside the block (tests, scripts with a sealer of their own:
    cronbox.storage.payload_keys.sealer_of(settings)); an app context of a cronbox app uses its app's."""
    token = _override.set(sealer)
    try:
        yield
    finally:
        _override.reset(token)


def current() -> Sealer | None:
    """The sealer of this context: an app's (inside an app context of an app cronbox is set up on),
    else `using()`'s, else the resolver's standalone one (None when there is no vault)."""
    sealer = _override.get()
    if (sealer is not None and not _in_cronbox_app()) or not _resolver:
        return sealer
    try:
        return _resolver[0]()
    except CronboxError:  # a host process outside an app context: whose keys? none
        return None


def sealer_for(*, sealed: Sealing, what: str) -> Sealer | None:
    """The sealer a row about to be inserted is sealed with, or None: its payload stays plaintext.

    sealed=True, or any payload under CRONBOX_SEAL_PAYLOADS=all: the current sealer; NoVault when
    there is none, VaultUnusable when its key folder cannot be used (one line each, nothing written).
    BY_DEFAULT: the same where it can, else None, said once per process and reason. False: None.
    Finding the sealer reads settings only; its key folder is read here (cached a second, made on
    first use), never a connection of its own."""
    sealer = current()
    if sealed is True and sealer is None:
        raise NoVault(what)
    if sealer is None or (sealed is False and not sealer.seal_all):
        if sealed == BY_DEFAULT:
            _stored_plain(what, f"no key vault is configured in this process ({WHERE_VAULTS})")
        return None
    try:
        sealer.keys.active()
    except VaultUnusable as exc:
        if sealed == BY_DEFAULT and not sealer.seal_all:
            _stored_plain(what, f"the key vault is not usable: {exc}")
            return None
        raise VaultUnusable(f"{what} is sealed, but the key vault is not usable: {exc}") from None
    return sealer


_said: set[str] = set()  # the reasons _stored_plain logged in this process


def _stored_plain(what: str, why: str) -> None:
    """One warning per process and reason: a payload sealed by default went into its row plain."""
    if why not in _said:
        _said.add(why)
        log.warning("sealed payloads: %s stored unsealed (the channel jobs are sealed where a key vault is usable): "
                    "%s; `python -m cronbox health` counts such rows, `python -m cronbox storage seal-payloads` "
                    "seals them", what, why)


def _in_cronbox_app() -> bool:
    """Inside an app context of an app cronbox is set up on? Only a process that imported Flask can be:
    the outbox never imports it."""
    flask = sys.modules.get("flask")
    return flask is not None and flask.has_app_context() and "cronbox" in flask.current_app.extensions


def seal_for_insert(connection: Connection, table: str, name: str, body: str, *, sealed: Sealing,
                    what: str) -> tuple[str, str | None]:
    """(payload column, seal_id column) of a row about to be inserted: the envelope when sealer_for()
    gives a sealer, else the text as it is."""
    sealer = sealer_for(sealed=sealed, what=what)
    return (body, None) if sealer is None else sealer.seal(connection, table, name, body)


def open_payload(runtime: Any, table: str, name: str, seal_id: str | None, text: str,
                 connection: Connection | None = None) -> Any:
    """The payload of a claimed row, in this process's memory only: the JSON value of a plaintext row
    as before, an envelope opened first (under `runtime`'s keys; runtime=None: the current sealer's,
    as record() and dispatch() find it). Raises PayloadIntegrityError / MissingPayloadKey (the item
    fails, its row is kept)."""
    if not is_sealed(text):
        return load_payload(text)
    sealer = runtime.sealer() if runtime is not None else current()
    if sealer is None:
        raise SealError(f"sealed payload, but no key vault is configured in this process: {WHERE_VAULTS}")
    if connection is None and runtime is None:
        raise SealError("sealed payload: no connection to read the database's install id on")
    if connection is None:
        with runtime.engine.connect() as own:
            return load_payload(sealer.open(own, table, name, seal_id, text))
    return load_payload(sealer.open(connection, table, name, seal_id, text))
