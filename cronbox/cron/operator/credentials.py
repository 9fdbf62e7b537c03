"""The operator's password: where its hash lives, and the one-time setup token of a fresh install.

One operator, one password. Its hash (Werkzeug's format: scrypt by default) comes from
`CRONBOX_OPS_PASSWORD_HASH` in `.env` when set, otherwise from `<instance>/ops-password`, a file
the first-run setup page writes. A fresh install has neither: the setup page then writes a random
token to `<instance>/ops-setup-token` (0600, readable through cPanel's File Manager) and asks for
it, so nobody who merely finds the site first can claim it. The token is never logged or shown;
it is deleted when a password is set.

Forgot the password? Delete `ops-password` in File Manager (or run `ops setup-token --reset` from a
cron line): the setup page asks for a fresh token again. This module does not import Flask: the
`ops` commands use it too.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from werkzeug.security import check_password_hash, generate_password_hash

from cronbox.outbox.core.errors import CronboxError
from cronbox.outbox.core.settings import Settings

log = logging.getLogger("cronbox")

HASH_FILE = "ops-password"
TOKEN_FILE = "ops-setup-token"
MIN_PASSWORD = 12
MAX_PASSWORD = 1024  # hashing a megabyte "password" is a cheap denial of service


@functools.cache
def _dummy_hash() -> str:
    """Checked against when no password exists, so a login takes as long either way."""
    return generate_password_hash("cronbox-no-password-set")


class CredentialError(CronboxError):
    """A password or token that cannot be accepted (the message says why, in one line)."""


def hash_from_env(settings: Settings) -> str | None:
    return settings.ops_password_hash


def hash_file(settings: Settings) -> Path:
    return settings.instance / HASH_FILE


def token_file(settings: Settings) -> Path:
    return settings.instance / TOKEN_FILE


def password_hash(settings: Settings) -> str | None:
    """The hash in force, or None on a fresh install (setup needed)."""
    configured = hash_from_env(settings)
    if configured:
        return configured
    try:
        text = hash_file(settings).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def is_configured(settings: Settings) -> bool:
    return password_hash(settings) is not None


def check_password(settings: Settings, password: str) -> bool:
    """Constant work whether or not a password is set; a malformed hash in .env refuses every login."""
    stored = password_hash(settings)
    if len(password) > MAX_PASSWORD:
        return False
    try:
        ok = check_password_hash(stored or _dummy_hash(), password)
    except (ValueError, TypeError):
        log.error("ops: the operator password hash is not in a format Werkzeug knows; every login is refused")
        return False
    return ok and stored is not None


def validate_new_password(password: str, confirm: str) -> None:
    if password != confirm:
        raise CredentialError("the two passwords differ")
    if len(password) < MIN_PASSWORD:
        raise CredentialError(f"use at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise CredentialError(f"use at most {MAX_PASSWORD} characters")


def make_hash(password: str) -> str:
    return generate_password_hash(password)


def _write_private(path: Path, text: str, *, replace: bool) -> bool:
    """Write a 0600 file atomically (temporary file, fsync, rename or link, fsync of the folder); with
    replace=False, False if it already exists (first writer wins). A failure leaves no temporary file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    data = text.encode("utf-8")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(temporary, path)
        else:
            try:
                os.link(temporary, path)
            except FileExistsError:
                return False
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        return True
    finally:
        temporary.unlink(missing_ok=True)


def fingerprint(settings: Settings) -> str | None:
    """A short digest of the password hash in force (None when none is set); sessions keep it."""
    stored = password_hash(settings)
    return hashlib.sha256(stored.encode("utf-8")).hexdigest()[:16] if stored else None


def store_password(settings: Settings, password: str, *, replace: bool) -> None:
    """Write the hash file; delete the setup token. replace=False: refuse if a password already exists."""
    if hash_from_env(settings):
        raise CredentialError("CRONBOX_OPS_PASSWORD_HASH is set in .env and wins over the password file: "
                              "change it there")
    if not _write_private(hash_file(settings), make_hash(password) + "\n", replace=replace):
        raise CredentialError("a password has already been set")
    token_file(settings).unlink(missing_ok=True)
    log.info("ops: operator password set (hash in %s)", hash_file(settings))


def ensure_setup_token(settings: Settings) -> Path | None:
    """On a fresh install, make sure a setup token file exists; returns its path (None if configured)."""
    if is_configured(settings):
        return None
    path = token_file(settings)
    if not path.exists():
        settings.private_dir()
        if _write_private(path, secrets.token_urlsafe(24) + "\n", replace=False):
            log.warning("ops: no operator password yet; a setup token was written to %s "
                        "(open it in File Manager, then visit /ops/setup)", path)
    return path


def new_setup_token(settings: Settings, *, reset: bool) -> Path:
    """`ops setup-token`: a fresh token (reset=True also removes the password file, to recover access)."""
    if hash_from_env(settings):
        raise CredentialError("CRONBOX_OPS_PASSWORD_HASH is set in .env: change or remove it there")
    if hash_file(settings).exists():
        if not reset:
            raise CredentialError("a password is set; pass --reset to remove it and allow setup again")
        hash_file(settings).unlink()
    settings.private_dir()
    _write_private(token_file(settings), secrets.token_urlsafe(24) + "\n", replace=True)
    log.warning("ops: a new setup token was written to %s", token_file(settings))
    return token_file(settings)


def check_setup_token(settings: Settings, offered: str) -> bool:
    try:
        expected = token_file(settings).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return False
    offered = offered.strip()
    return bool(expected) and hmac.compare_digest(offered.encode("utf-8", "replace"), expected.encode("utf-8"))
