"""Settings: `.env` in the app root first, then the process environment.

Cron on a shared host starts us with a bare environment and `$HOME` as the
working directory, so nothing here may depend on either: the app root is the
folder this package lives in, and every relative path is resolved against it.
The environment wins over `.env` so tests and one-off runs can override a value.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from dotenv import dotenv_values

from .errors import SettingsError

APP_ROOT = Path(__file__).resolve().parent.parent

CLAIM_MODES = ("auto", "skip-locked", "token")
TLS_MODES = ("off", "on")


@dataclass(frozen=True)
class Settings:
    app_root: Path
    instance: Path
    database_url: str
    handlers: tuple[str, ...]
    queues: tuple[str, ...]
    claim_mode: str
    lease_margin: float
    cron_interval: int
    health_token: str | None
    cron_token: str | None
    upload_token: str | None
    ops_password_hash: str | None
    trusted_proxies: int
    mysql_tls: str
    pool_recycle: int
    # Every value from .env and the environment, for settings a module parses itself
    # (channels: CRONBOX_SMS_*, CRONBOX_SMTP_*...). Not shown in repr: it holds secrets.
    raw: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def get(self, name: str, default: str | None = None) -> str | None:
        value = (self.raw.get(name) or "").strip()
        return value or default

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def logs_dir(self) -> Path:
        return self.instance / "logs"

    @property
    def locks_dir(self) -> Path:
        return self.instance / "locks"

    def private_dir(self, *parts: str) -> Path:
        """A folder under the instance folder, created 0700 (the instance holds the database, keys and
        logs: nobody else on a shared host may read it)."""
        path = self.instance.joinpath(*parts)
        for folder in [self.instance, *[self.instance.joinpath(*parts[:i + 1]) for i in range(len(parts))]]:
            if not folder.is_dir():
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                folder.chmod(0o700)  # mkdir's mode is filtered by the umask
        return path


def load_settings(app_root: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    root = Path(app_root or APP_ROOT).resolve()
    values: dict[str, str] = {}
    env_file = root / ".env"
    if env_file.is_file():
        values.update({k: v for k, v in dotenv_values(env_file).items() if v is not None})
    values.update(os.environ if environ is None else environ)

    def get(name: str) -> str | None:
        raw = values.get(name)
        if raw is None:
            return None
        raw = raw.strip()
        return raw or None

    instance = _resolve(root, get("CRONBOX_INSTANCE") or "instance")
    database_url = _absolute_sqlite_url(root, get("DATABASE_URL") or f"sqlite:///{instance / 'cronbox.db'}")
    claim_mode = (get("CRONBOX_CLAIM_MODE") or "auto").lower()
    if claim_mode not in CLAIM_MODES:
        raise SettingsError(f"CRONBOX_CLAIM_MODE={claim_mode!r} is not one of {', '.join(CLAIM_MODES)}")
    mysql_tls = get("CRONBOX_MYSQL_TLS") or "off"
    if mysql_tls.lower() in TLS_MODES:
        mysql_tls = mysql_tls.lower()
    elif not Path(mysql_tls).is_file():
        raise SettingsError(
            f"CRONBOX_MYSQL_TLS={mysql_tls!r} must be off, on, or the path of a CA bundle file"
        )
    handlers = tuple(h.strip() for h in (get("CRONBOX_HANDLERS") or "").split(",") if h.strip())
    return Settings(
        app_root=root,
        instance=instance,
        database_url=database_url,
        handlers=handlers,
        queues=tuple(q.strip() for q in (get("CRONBOX_QUEUES") or "").split(",") if q.strip()),
        claim_mode=claim_mode,
        lease_margin=_number(get, "CRONBOX_LEASE_MARGIN", 30.0, float, minimum=0),
        cron_interval=_number(get, "CRONBOX_CRON_INTERVAL", 1, int, minimum=1),
        health_token=get("CRONBOX_HEALTH_TOKEN"),
        cron_token=get("CRONBOX_CRON_TOKEN"),
        upload_token=get("CRONBOX_UPLOAD_TOKEN"),
        ops_password_hash=get("CRONBOX_OPS_PASSWORD_HASH"),
        trusted_proxies=_number(get, "CRONBOX_TRUSTED_PROXIES", 0, int, minimum=0),
        mysql_tls=mysql_tls,
        pool_recycle=_number(get, "CRONBOX_POOL_RECYCLE", 15, int, minimum=1),
        raw=dict(values),
    )


def _resolve(root: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return (path if path.is_absolute() else root / path).resolve()


def _absolute_sqlite_url(root: Path, url: str) -> str:
    """`sqlite:///instance/x.db` means the app root's instance folder, not cron's $HOME."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and url != "sqlite://" and not url.startswith("sqlite:////"):
        rest = url[len(prefix):]
        if rest and rest != ":memory:" and not rest.startswith("file:"):
            return prefix + str(_resolve(root, rest))
    return url


def _number(get, name: str, default, kind, *, minimum):
    raw = get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return value
