"""Settings: `.env` in the app root first, then the process environment (then, inside a host
Flask app, its `app.config["CRONBOX_*"]`, passed in as `overrides`).

Cron on a shared host starts us with a bare environment and `$HOME` as the
working directory, so nothing here may depend on either. The app root is, in order:
CRONBOX_APP_ROOT (artisan_via_cron.sh exports its own folder); the working directory when it holds artisan_via_cron.sh (which runs
from its own folder; `python -m cronbox install-script` puts a copy into a host app's); this
checkout when cronbox runs from one (the standalone app); the working directory when it holds
a .env. Every relative path is resolved against it. An
installed cronbox with none of them, and no DATABASE_URL or CRONBOX_APP either,
refuses to start rather than create a database inside site-packages.
The environment wins over `.env` so tests and one-off runs can override a value.
"""
from __future__ import annotations

import math
import os
import sysconfig
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit

from dotenv import dotenv_values

from cronbox.outbox.core.durations import parse_duration
from cronbox.outbox.core.errors import SettingsError

# cronbox/outbox/core/settings.py -> the folder holding the package: a checkout, or site-packages. Plain
# folders all the way (no links), so a copy of the checkout (a ZIP, cPanel's File Manager, rsync) is one too.
CHECKOUT = Path(__file__).resolve().parents[3]
ROOT_MARKERS = ("artisan_via_cron.sh", ".env")

CLAIM_MODES = ("auto", "skip-locked", "token")
TLS_MODES = ("off", "on")
SEAL_ALGORITHMS = ("auto", "aes-256-gcm", "xchacha20-poly1305")
SEAL_PAYLOADS = ("declared", "all")

# Audit records (the sealed files' access audit and the console's action log) are kept at least six
# years: HIPAA 45 CFR 164.316(b)(2). Six years hold up to two leap days, hence 2192 days, the default too.
AUDIT_RETENTION_FLOOR_DAYS = 2192
AUDIT_FLOOR_WHY = "HIPAA (45 CFR 164.316(b)(2)) asks six years for audit records"
ACK_FLUSH_DEFAULT = 0.5  # seconds of handler time (CRONBOX_ACK_FLUSH)
ACK_FLUSH_BOUNDS, ACK_FLUSH_WHY = (0.001, 3600.0), "1ms and 1h"
# Duration settings a module parses itself, with its own bounds (Settings.duration); load_settings
# parses each one too, so a bare number or a typo stops every command and init_app at once.
MODULE_DURATIONS = ("CRONBOX_METRICS_WINDOW", "CRONBOX_PROFILE_TTL", "CRONBOX_ADMISSION_TIME_HEADROOM",
                    "CRONBOX_FORWARD_WARN_AFTER", "CRONBOX_FORWARD_FAIL_AFTER", "CRONBOX_RESULT_TTL",
                    "CRONBOX_IDEMPOTENCY_TTL")


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
    # Sealed storage (storage/). Defaults keep older constructors of Settings working.
    keys_dir: Path | None = None  # None: <instance>/keys
    web_roots: tuple[Path, ...] = ()  # folders a web server serves: keys and sealed files must not be inside
    upload_max: int = 256 * 1024 * 1024
    url_max_ttl: int = 3600
    seal_algorithm: str = "auto"
    seal_payloads: str = "declared"  # CRONBOX_SEAL_PAYLOADS: "all" seals every event and job payload
    audit_retention_days: int = 2192
    inbox_retention_days: int = 14  # CRONBOX_INBOX_RETENTION_DAYS: a redelivery older than this runs again
    ops_show_file_names: bool = False  # the console's Files page unseals file names (they can be PHI)
    log_stderr: bool = False  # CRONBOX_LOG_STDERR: the log lines on stderr too (systemd's journal), not only in files
    base_url: str | None = None  # CRONBOX_BASE_URL, normalized without a trailing slash: absolute links
    files_prefix: str = ""  # CRONBOX_FILES_PREFIX: where the host mounted /files (links are built with it)
    # Group commit (outbox.engine.group_commit.CommitGroup): how many grouped handlers' items share one
    # transaction at most, and for how long (ms) it stays open past its first handler at most.
    group_max: int = 50
    group_ms: int = 200
    # CRONBOX_ACK_FLUSH (outbox.engine.runner.QuietAcks): the handler time, in seconds, after which the
    # finished items of handlers that wrote nothing are acked, whatever is left of their batch. A crash
    # runs again what is not acked yet: at most this much handler time of them (and the item in hand).
    ack_flush: float = ACK_FLUSH_DEFAULT
    # Every value from .env and the environment, for settings a module parses itself
    # (channels: CRONBOX_SMS_*, CRONBOX_SMTP_*...). Not shown in repr: it holds secrets.
    raw: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def get(self, name: str, default: str | None = None) -> str | None:
        value = (self.raw.get(name) or "").strip()
        return value or default

    def duration(self, name: str, default: float, *, bounds: tuple[float, float], why: str) -> float:
        """A duration setting a module reads itself (CRONBOX_METRICS_WINDOW...), in seconds within
        `bounds`; SettingsError naming it otherwise, `why` saying the range in words."""
        return _duration(self.get, name, default, bounds=bounds, why=why)

    def audit_cutoff(self, now: datetime) -> datetime:
        """Audit records older than this may be deleted (storage sweep, the daily prune of the console's
        action log). A Settings made in code below the floor is refused here too, before any delete."""
        if self.audit_retention_days < AUDIT_RETENTION_FLOOR_DAYS:
            raise SettingsError(f"CRONBOX_AUDIT_RETENTION={self.audit_retention_days}d is below its floor of "
                                f"{AUDIT_RETENTION_FLOOR_DAYS}d: {AUDIT_FLOOR_WHY}")
        return now - timedelta(days=self.audit_retention_days)

    def number(self, name: str, default, kind=int, *, minimum=0, above=None):
        """A numeric setting a module reads itself (CRONBOX_MAX_CONNECTIONS...): `default` when unset,
        SettingsError naming it when it is not a finite number of `kind`, below `minimum` or not
        above `above`. The one parser of plain numbers (durations: `duration`, sizes: `_size`)."""
        return _number(self.get, name, default, kind, minimum=minimum, above=above)

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

    @property
    def sealed_dir(self) -> Path:
        """Where sealed files live: <instance>/private/ (outside the web root)."""
        return self.instance / "private"

    @property
    def key_folder(self) -> Path:
        return self.keys_dir or self.instance / "keys"


def is_checkout(folder: Path = CHECKOUT) -> bool:
    """Is this cronbox running from its own source tree (the standalone app), not an installed copy?
    The package's place decides it, which survives any copy: the folder holding `cronbox/` also holds the
    cron script and the standalone `app.py`, and is no interpreter's site-packages."""
    return ((folder / "artisan_via_cron.sh").is_file() and (folder / "app.py").is_file()
            and (folder / "cronbox" / "__init__.py").is_file() and not _installed(folder))


def _installed(path: Path) -> bool:
    """Inside an interpreter's site-packages (where nothing of the app may be created)?"""
    path = path.resolve()
    for name in ("purelib", "platlib"):
        where = sysconfig.get_paths().get(name)
        if where and path.is_relative_to(Path(where).resolve()):
            return True
    return "site-packages" in path.parts or "dist-packages" in path.parts


def find_app_root(environ: Mapping[str, str] | None = None) -> Path | None:
    """The app root by the rules in this module's docstring, or None when there is none."""
    environ = os.environ if environ is None else environ
    configured = (environ.get("CRONBOX_APP_ROOT") or "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    cwd = Path.cwd()
    if _installed(cwd):
        cwd = None
    # The script before the checkout: a host app using an editable install (`pip install -e`) of this
    # checkout runs from its own folder. A bare .env after it: cron's $HOME may hold someone else's.
    if cwd is not None and (cwd / "artisan_via_cron.sh").is_file():
        return cwd
    if is_checkout():
        return CHECKOUT
    if cwd is not None and any((cwd / marker).is_file() for marker in ROOT_MARKERS):
        return cwd
    return None


NO_APP_ROOT = ("no app root: run from the folder holding artisan_via_cron.sh (`python -m cronbox install-script DIR` "
               "puts one there), or set CRONBOX_APP_ROOT, CRONBOX_APP=module:factory or DATABASE_URL")


def load_settings(app_root: Path | None = None, environ: Mapping[str, str] | None = None, *,
                  overrides: Mapping[str, str] | None = None, instance: Path | None = None) -> Settings:
    """`overrides` (a host app's config) win over everything; `instance` is the default instance folder
    when CRONBOX_INSTANCE is not set (a host app's instance_path/cronbox)."""
    env = os.environ if environ is None else environ
    found = Path(app_root).resolve() if app_root else find_app_root(env)
    if found is None:
        if not any((env.get(name) or "").strip() for name in ("DATABASE_URL", "CRONBOX_APP")):
            raise SettingsError(NO_APP_ROOT)
        found = Path.cwd()
    root = found
    values: dict[str, str] = {}
    env_file = root / ".env"
    if env_file.is_file():
        values.update({k: v for k, v in dotenv_values(env_file).items() if v is not None})
    values.update(env)
    values.update(overrides or {})

    def get(name: str) -> str | None:
        raw = values.get(name)
        if raw is None:
            return None
        raw = raw.strip()
        return raw or None

    instance = _resolve(root, get("CRONBOX_INSTANCE")) if get("CRONBOX_INSTANCE") else (
        Path(instance).resolve() if instance else root / "instance")
    if _installed(instance):  # an installed cronbox never writes into its own install folder
        raise SettingsError(f"the instance folder {instance} would be inside site-packages: set CRONBOX_INSTANCE "
                            "or CRONBOX_APP_ROOT")
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
    seal_algorithm = (get("CRONBOX_SEAL_ALGORITHM") or "auto").lower()
    if seal_algorithm not in SEAL_ALGORITHMS:
        raise SettingsError(f"CRONBOX_SEAL_ALGORITHM={seal_algorithm!r} is not one of {', '.join(SEAL_ALGORITHMS)}")
    seal_payloads = (get("CRONBOX_SEAL_PAYLOADS") or "declared").lower()
    if seal_payloads not in SEAL_PAYLOADS:
        raise SettingsError(f"CRONBOX_SEAL_PAYLOADS={seal_payloads!r} is not one of {', '.join(SEAL_PAYLOADS)}")
    for name in MODULE_DURATIONS:
        _duration(get, name, 0)
    return Settings(
        app_root=root,
        instance=instance,
        database_url=database_url,
        handlers=handlers,
        queues=tuple(q.strip() for q in (get("CRONBOX_QUEUES") or "").split(",") if q.strip()),
        claim_mode=claim_mode,
        lease_margin=_number(get, "CRONBOX_LEASE_MARGIN", 30.0, float, minimum=0),
        group_max=_number(get, "CRONBOX_GROUP_MAX", 50, int, minimum=1),
        group_ms=_number(get, "CRONBOX_GROUP_MS", 200, int, minimum=0),
        ack_flush=_duration(get, "CRONBOX_ACK_FLUSH", ACK_FLUSH_DEFAULT, bounds=ACK_FLUSH_BOUNDS, why=ACK_FLUSH_WHY,
                            example_unit="ms"),
        cron_interval=_number(get, "CRONBOX_CRON_INTERVAL", 1, int, minimum=1),
        health_token=get("CRONBOX_HEALTH_TOKEN"),
        cron_token=get("CRONBOX_CRON_TOKEN"),
        upload_token=get("CRONBOX_UPLOAD_TOKEN"),
        ops_password_hash=get("CRONBOX_OPS_PASSWORD_HASH"),
        trusted_proxies=_number(get, "CRONBOX_TRUSTED_PROXIES", 0, int, minimum=0),
        mysql_tls=mysql_tls,
        pool_recycle=_number(get, "CRONBOX_POOL_RECYCLE", 15, int, minimum=1),
        keys_dir=_resolve(root, get("CRONBOX_KEYS")) if get("CRONBOX_KEYS") else None,
        web_roots=_web_roots(root, get("CRONBOX_WEB_ROOT"), values.get("HOME")),
        upload_max=_size(get, "CRONBOX_UPLOAD_MAX", 256 * 1024 * 1024),
        url_max_ttl=int(_duration(get, "CRONBOX_URL_MAX_TTL", 3600)),
        seal_algorithm=seal_algorithm,
        seal_payloads=seal_payloads,
        audit_retention_days=int(_duration(
            get, "CRONBOX_AUDIT_RETENTION", AUDIT_RETENTION_FLOOR_DAYS * 86400,
            floor=(AUDIT_RETENTION_FLOOR_DAYS * 86400, f"{AUDIT_RETENTION_FLOOR_DAYS}d: {AUDIT_FLOOR_WHY}")) // 86400),
        inbox_retention_days=_number(get, "CRONBOX_INBOX_RETENTION_DAYS", 14, int, minimum=1),
        ops_show_file_names=_switch(get, "CRONBOX_OPS_SHOW_FILE_NAMES"),
        log_stderr=_switch(get, "CRONBOX_LOG_STDERR"),
        base_url=_base_url(get("CRONBOX_BASE_URL")),
        files_prefix=url_prefix(get("CRONBOX_FILES_PREFIX"), "CRONBOX_FILES_PREFIX"),
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


def _web_roots(root: Path, configured: str | None, home: str | None) -> tuple[Path, ...]:
    """CRONBOX_WEB_ROOT (comma-separated) or cPanel's ~/public_html, plus the app's static folder."""
    if configured:
        roots = [_resolve(root, part.strip()) for part in configured.split(",") if part.strip()]
    else:
        roots = [Path(home).expanduser().resolve() / "public_html"] if home else []
    return tuple(roots) + (root / "static",)


_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


def _size(get, name: str, default: int) -> int:
    """Bytes, with an optional K/M/G (binary) suffix: 256M, 2G, 1048576."""
    raw = get(name)
    if raw is None:
        return default
    text_ = raw.lower().removesuffix("ib").removesuffix("b")
    unit = text_[-1:] if text_[-1:] in _SIZE_UNITS else ""
    try:
        value = int(float(text_[: len(text_) - len(unit)]) * _SIZE_UNITS[unit])
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a size (use e.g. 256M, 2G)") from None
    if value < 1:
        raise SettingsError(f"{name}={raw!r} must be at least 1 byte")
    return value


def _duration(get, name: str, default: float, *, bounds: tuple[float, float] | None = None,
              why: str = "", floor: tuple[float, str] | None = None, example_unit: str = "d") -> float:
    """A duration setting ("500ms", "90s", "15m", "2h", "7d"; a bare number is refused, its error
    suggesting `example_unit`) in seconds: within `bounds` (said as `why` in the error) when given,
    else at least 1 s; and at least `floor` (seconds, and the floor and its reason in words)."""
    raw = get(name)
    if raw is None:
        return default
    raw = raw if raw.isprintable() else repr(raw)  # the error stays one line
    try:
        value = parse_duration(raw, example_unit=example_unit)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw}: {exc}") from None
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise SettingsError(f"{name}={raw} must be between {why}")
    if floor is not None and value < floor[0]:
        raise SettingsError(f"{name}={raw} is below its floor of {floor[1]}")
    if bounds is None and value < 1:
        raise SettingsError(f"{name}={raw} must be at least 1 second")
    return value


def _number(get, name: str, default, kind, *, minimum=None, above=None):
    """A plain number setting (int or float `kind`): NaN and infinity are no numbers of seconds,
    connections or workers, and are refused as their words are."""
    raw = get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingsError(f"{name}={raw!r} is not a finite number")
    if above is not None and value <= above:
        raise SettingsError(f"{name}={raw!r} must be more than {above}")
    if minimum is not None and value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _base_url(raw: str | None) -> str | None:
    """The site's own address, the only source of absolute links: never a request's Host header, which
    whoever sends the request chooses. `https://host/app/` becomes `https://host/app` (links append
    `/files/...`); anything a link could not be built on safely is refused here, at start-up."""
    if raw is None:
        return None
    refuse = f"CRONBOX_BASE_URL={raw!r} must be http(s)://host[:port][/path], without user, query or fragment"
    if any(ch.isspace() or not ch.isprintable() or ch == "\\" for ch in raw):
        raise SettingsError(refuse)
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in 0-65535
    except ValueError:
        raise SettingsError(refuse) from None
    if (parts.scheme.lower() not in ("http", "https") or not parts.hostname or "@" in parts.netloc
            or parts.query or parts.fragment or "?" in raw or "#" in raw):
        raise SettingsError(refuse)
    return f"{parts.scheme.lower()}://{parts.netloc}{parts.path.rstrip('/')}"


def _switch(get, name: str) -> bool:
    value = (get(name) or "off").lower()
    if value not in ("on", "off"):
        raise SettingsError(f"{name}={value!r} must be on or off")
    return value == "on"


def url_prefix(raw: str | None, name: str) -> str:
    """A URL prefix for one of cronbox's parts in a host app: "" or "/a/b" (no trailing slash)."""
    if raw is None or raw.strip("/ ") == "":
        return ""
    value = "/" + raw.strip().strip("/")
    if not all(part and part not in (".", "..") and all(ch.isascii() and (ch.isalnum() or ch in "-._~") for ch in part)
               for part in value[1:].split("/")):
        raise SettingsError(f"{name}={raw!r} must be a path such as /clinic/files-area (letters, digits, - . _ ~)")
    return value
