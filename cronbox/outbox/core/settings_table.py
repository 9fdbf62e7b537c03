"""Every setting cronbox reads, in one table: name, kind, default and meaning.

The code reads settings where it uses them (`load_settings` for the ones every command needs, a
module for its own: the channels, health, admission...). This table is what the documentation's
settings reference is generated from (docs/_ext/cronbox_reference.py), and
tests/units/test_docs_reference.py compares it with every `CRONBOX_*` name the code and
artisan_via_cron.sh read, so a setting added without a row here fails a test, and a row whose setting
the code no longer reads fails too.

A default is written as the reader sees it (`30`, `1h`, `unset`); `kind` says how the value is read:
a duration needs a unit (`s`, `m`, `h`, `d`, `w`), a number of seconds or minutes does not.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # how the value is read: see KINDS
    default: str  # as the reader sees it; "unset" when nothing is assumed
    meaning: str  # one paragraph of Markdown
    group: str  # the reference page's section
    internal: bool = False  # set by cronbox itself or by its tests, never by a user

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")
        if self.group not in GROUPS:
            raise ValueError(f"{self.name}: unknown group {self.group!r}")


KINDS = {
    "text": "text",
    "path": "a path, relative to the app root",
    "url": "a URL",
    "switch": "`on` or `off`",
    "choice": "one of the values named",
    "list": "comma-separated names",
    "seconds": "a number of seconds",
    "minutes": "a number of minutes",
    "days": "a number of days",
    "duration": "a duration with its unit: `500ms`, `90s`, `15m`, `2h`, `7d`, `1w`",
    "number": "a whole number",
    "percent": "a percentage",
    "megabytes": "a number of MB",
    "size": "a size with an optional K, M or G suffix",
    "rate": "a rate, `N/s`, `N/m` or `N/h`",
    "budgets": "`name=N/unit` pairs, comma-separated",
    "secret": "a secret: a token, password or key (never logged)",
}

GROUPS = {
    "app": "Where the app is",
    "host": "Inside your Flask app",
    "work": "Events and jobs",
    "pool": "Worker pools and admission",
    "web": "Web endpoints and their tokens",
    "health": "Health, metrics and alerts",
    "files": "Sealed files",
    "channels": "Channels (SMS, e-mail)",
    "broker": "RabbitMQ",
    "console": "Operator console",
    "internal": "Set by cronbox itself",
}

PARTS = ("files", "health", "metrics", "webcron", "ops")  # cronbox.web's parts: each a switch and a prefix
_PART_PATHS = {"files": "`GET /files/<token>`, `POST /files`", "health": "`GET /health`",
               "metrics": "`GET /metrics`", "webcron": "`POST /cron/tick`", "ops": "the console, `/ops/`"}


def _parts() -> tuple[Setting, ...]:
    rows = []
    for part in PARTS:
        name = f"CRONBOX_{part.upper()}"
        rows.append(Setting(name, "switch", "on", f"`off` leaves {_PART_PATHS[part]} out of your app "
                                                  "(its blueprint is not registered).", "host"))
        rows.append(Setting(f"{name}_PREFIX", "path", "unset",
                            f"a URL path such as `/clinic` put in front of {_PART_PATHS[part]}"
                            + (" (signed links are built with it too)." if part == "files" else "."), "host"))
    return tuple(rows)


SETTINGS: tuple[Setting, ...] = (
    # --- where the app is -------------------------------------------------------------------------
    Setting("DATABASE_URL", "url", "sqlite:///<instance>/cronbox.db",
            "the standalone app's database, e.g. `mysql+pymysql://user:pw@localhost/db` or "
            "`postgresql://user:pw@localhost/db`. In your Flask app cronbox uses your `db`'s URL instead "
            "(`CRONBOX_DATABASE_URL` for another).", "app"),
    Setting("CRONBOX_DATABASE_URL", "url", "your `db`'s URL",
            "in your Flask app: another database for cronbox's tables.", "app"),
    Setting("CRONBOX_APP", "text", "unset",
            "your Flask app for cron commands, `module:factory` (e.g. `clinic:create_app`; plain `clinic` "
            "looks for `create_app`, `make_app`, `app`, `application`): every command builds it and uses its "
            "settings, database and handlers.", "app"),
    Setting("CRONBOX_APP_ROOT", "path", "found",
            "the app root (its `.env`, `instance/`) when it is not the folder holding `artisan_via_cron.sh` "
            "or `.env`; the script sets it to its own folder.", "app"),
    Setting("CRONBOX_INSTANCE", "path", "`<app root>/instance`; your app: `<app.instance_path>/cronbox`",
            "cronbox's instance folder: database file, logs, locks, keys, sealed files, run-once requests.",
            "app"),
    Setting("CRONBOX_HANDLERS", "list", "unset",
            "comma-separated modules that register consumers, jobs and tasks; imported by `init_app` (after "
            "your factory returned) and by every command; an import error exits 1 with its cause.", "app"),
    Setting("CRONBOX_PYTHON", "path", "found",
            "the interpreter `artisan_via_cron.sh` runs (environment, then the literal line of `.env`, which "
            "is never sourced); else `./venv/bin/python`, `./.venv/bin/python`, cPanel's Python Selector "
            "virtualenv, `python3`.", "app"),
    Setting("CRONBOX_LOG_STDERR", "switch", "off",
            "`on`: every log line also on standard error, for a supervisor that keeps it (systemd's "
            "journal); off for cron, which mails whatever a job writes there.", "app"),
    # --- inside your Flask app ---------------------------------------------------------------------
    *_parts(),
    # --- events and jobs ----------------------------------------------------------------------------
    Setting("CRONBOX_QUEUES", "list", "the queues of registered jobs",
            "the default queue priority order for workers and the tick.", "work"),
    Setting("CRONBOX_CLAIM_MODE", "choice", "auto",
            "`auto`, `skip-locked` (MySQL 8.0.1+, MariaDB 10.6+, PostgreSQL) or `token` (claims without "
            "`SKIP LOCKED`).", "work"),
    Setting("CRONBOX_LEASE_MARGIN", "seconds", "30",
            "added to a handler's `timeout` to make its lease.", "work"),
    Setting("CRONBOX_ACK_FLUSH", "duration", "500ms",
            "handler time (`1ms` to `1h`, with its unit) after which the finished items of handlers that do not "
            "use `ctx.session` are acked, rather than at their batch's end: a killed run repeats at most that "
            "much of them, plus the item in hand (it also caps `CRONBOX_GROUP_MS`).", "work"),
    Setting("CRONBOX_GROUP_MAX", "number", "50",
            "group commit: items in one transaction at most.", "work"),
    Setting("CRONBOX_GROUP_MS", "number", "200",
            "group commit: milliseconds after which no item joins a group.", "work"),
    Setting("CRONBOX_RESULT_TTL", "duration", "7d",
            "how long a job's result (its handler's return value) is kept after it is done (`1m` to `366d`, "
            "with its unit); then `job_fn.result()` says `expired`.", "work"),
    Setting("CRONBOX_RESULT_MAX", "number", "65536",
            "bytes of JSON a job's result may take; a larger one (or one that is not JSON) fails the "
            "attempt for good, with the reason.", "work"),
    Setting("CRONBOX_IDEMPOTENCY_TTL", "duration", "1d",
            "how long a finished job keeps its `idempotency_key` (`1s` to `366d`, with its unit): until then a "
            "dispatch with the same key returns that job's id (its row is pruned with the done jobs, after "
            "48 hours, whichever comes first).", "work"),
    Setting("CRONBOX_QUEUE_BUDGETS", "budgets", "unset",
            "cost budgets per queue and window (e.g. `sms=100/m,mail=2000/h`): the summed `cost` of the jobs "
            "a queue starts per window.", "work"),
    Setting("CRONBOX_GROUP_BUDGETS", "budgets", "unset",
            "cost budgets per concurrency group and window (e.g. `sms-provider=500/h`).", "work"),
    Setting("CRONBOX_GROUP_WAIT", "seconds", "2",
            "at least 0.05: how long a job whose concurrency group is full waits at most before it is tried "
            "again (less when a slot's lease ends sooner).", "work"),
    Setting("CRONBOX_CRON_INTERVAL", "minutes", "1",
            "minutes between cron runs of the tick: health's thresholds follow it.", "work"),
    Setting("CRONBOX_POOL_RECYCLE", "seconds", "15",
            "connections older than this are replaced; keep it below the server's `wait_timeout`.", "work"),
    Setting("CRONBOX_MYSQL_TLS", "choice", "off",
            "TLS to MySQL/MariaDB: `off`, `on`, or the path of a CA bundle.", "work"),
    Setting("CRONBOX_INBOX_RETENTION_DAYS", "days", "14",
            "at least 1: how long the daily prune keeps `cronbox_inbox` rows (messages `amqp consume` "
            "handled) and leftover `cronbox_redeliveries` counts; a redelivered or republished copy older "
            "than that runs its consumer again.", "work"),
    # --- pools and admission ------------------------------------------------------------------------
    Setting("CRONBOX_MAX_CONNECTIONS", "number", "5",
            "database connections a worker pool may use in all (shared MySQL users often get 3-10 in "
            "`max_user_connections`).", "pool"),
    Setting("CRONBOX_TICK_WORKERS", "number", "1",
            "worker processes the tick may drain a backlog with (1: in its own process).", "pool"),
    Setting("CRONBOX_ADMISSION", "switch", "on",
            "`off`: no handler profiles, no admission by profile.", "pool"),
    Setting("CRONBOX_PROFILE_WINDOW", "number", "20",
            "runs a handler's profile is made of (1 to 1000).", "pool"),
    Setting("CRONBOX_PROFILE_TTL", "duration", "7d",
            "how long a run counts in a profile (1m to 90d); a handler with none younger is admitted as "
            "unknown.", "pool"),
    Setting("CRONBOX_ADMISSION_TIME_HEADROOM", "duration", "2s",
            "time of `--max-time` kept free at a run's end (1 s to 1 h; at most a tenth of `--max-time`).",
            "pool"),
    Setting("CRONBOX_ADMISSION_MEMORY_HEADROOM", "megabytes", "8",
            "MB of `--memory` and of the kernel's limit kept free.", "pool"),
    # --- web endpoints ------------------------------------------------------------------------------
    Setting("CRONBOX_HEALTH_TOKEN", "secret", "unset",
            "bearer token for the full `GET /health` report (without it, only `{\"status\": ...}`).", "web"),
    Setting("CRONBOX_METRICS_TOKEN", "secret", "the health token",
            "bearer token for `GET /metrics` (neither set: no endpoint); its own token lets a scraper in "
            "without the health detail.", "web"),
    Setting("CRONBOX_CRON_TOKEN", "secret", "unset (endpoint off)",
            "bearer token for `POST /cron/tick`, the web cron.", "web"),
    Setting("CRONBOX_WEB_TICK_MAX_TIME", "seconds", "20", "web tick: seconds of work.", "web"),
    Setting("CRONBOX_WEB_TICK_INTERVAL", "seconds", "30",
            "web tick: minimum seconds between calls (closer ones get 429).", "web"),
    Setting("CRONBOX_WEB_TICK_MEMORY", "megabytes", "256", "web tick: memory budget.", "web"),
    Setting("CRONBOX_UPLOAD_TOKEN", "secret", "unset (uploads off)",
            "bearer token for `POST /files`, compared in constant time.", "web"),
    Setting("CRONBOX_TRUSTED_PROXIES", "number", "0",
            "proxy hops to trust in `X-Forwarded-For` / `-Proto` (audit IP, login throttling, Secure "
            "cookie).", "web"),
    Setting("CRONBOX_BASE_URL", "url", "unset",
            "the site's address, e.g. `https://clinic.example` or `https://host/app`: absolute signed links "
            "are built on it, never on a request's `Host`.", "web"),
    # --- health, metrics, alerts --------------------------------------------------------------------
    Setting("CRONBOX_METRICS_WINDOW", "duration", "1h",
            "what `cronbox_handled` and `cronbox_runs` sum over (1m to 7d).", "health"),
    Setting("CRONBOX_FORWARD_WARN_AFTER", "duration", "10m",
            "health's `forward.<name>` check (and the tick's stderr line) warns when a forward target's "
            "deliveries have kept failing this long.", "health"),
    Setting("CRONBOX_FORWARD_FAIL_AFTER", "duration", "1h",
            "... and fails past this.", "health"),
    Setting("CRONBOX_MEMORY_WARN", "percent", "80",
            "health's `memory` check warns above this share of the cgroup (or readable LVE) memory limit in "
            "use (page cache left out).", "health"),
    Setting("CRONBOX_MEMORY_FAIL", "percent", "95", "... and fails above this.", "health"),
    Setting("CRONBOX_CGROUP_ROOT", "path", "/sys/fs/cgroup",
            "where the cgroup files are mounted (the group itself comes from `/proc/self/cgroup`).", "health"),
    Setting("CRONBOX_LVE_LIST", "path", "/proc/lve/list",
            "CloudLinux's LVE list, read for this account's memory limit where readable.", "health"),
    Setting("CRONBOX_ADMIN_EMAIL", "text", "unset",
            "where admin alerts go by e-mail (failing health checks, paused channels, unknown SMS "
            "outcomes).", "health"),
    Setting("CRONBOX_ADMIN_PHONE", "text", "unset", "where admin alerts go by SMS.", "health"),
    Setting("CRONBOX_ALERT_WEBHOOK_URL", "url", "unset",
            "admin alerts also POSTed there, signed; `https://` (`http://` only to loopback). Set with "
            "`CRONBOX_ALERT_WEBHOOK_SECRET`, or neither.", "health"),
    Setting("CRONBOX_ALERT_WEBHOOK_SECRET", "secret", "unset",
            "the HMAC-SHA256 key of `X-Cronbox-Signature` on those POSTs.", "health"),
    # --- sealed files -------------------------------------------------------------------------------
    Setting("CRONBOX_KEYS", "path", "<instance>/keys",
            "master and URL-signing keys (0700 folder, 0600 files, outside the web root).", "files"),
    Setting("CRONBOX_WEB_ROOT", "list", "~/public_html",
            "comma-separated public folders (the app's `static/` always counts); keys and sealed files "
            "inside them are refused.", "files"),
    Setting("CRONBOX_UPLOAD_MAX", "size", "256M", "the largest upload.", "files"),
    Setting("CRONBOX_URL_MAX_TTL", "duration", "1h", "the longest lifetime of a signed link.", "files"),
    Setting("CRONBOX_SEAL_ALGORITHM", "choice", "auto",
            "`auto` (AES-256-GCM with AES-NI, else XChaCha20-Poly1305), `aes-256-gcm` or "
            "`xchacha20-poly1305`.", "files"),
    Setting("CRONBOX_SEAL_PAYLOADS", "choice", "declared",
            "`declared` (events and jobs declared `sealed=True`, and the channel jobs) or `all` (every event and "
            "job payload): sealed payloads are AES-256-GCM envelopes under the key vault "
            "(docs/howto/sealed-payloads.md).", "files"),
    Setting("CRONBOX_AUDIT_RETENTION", "duration", "2192d",
            "how long `storage sweep` keeps the file access audit and the daily prune the console's action "
            "log; at least `2192d` (HIPAA 45 CFR 164.316(b)(2): six years), less is refused.", "files"),
    # --- channels -----------------------------------------------------------------------------------
    Setting("CRONBOX_SMS_DRIVER", "choice", "log",
            "`log`, `kavenegar` or `twilio`; `test` in tests (messages kept in memory: `cronbox.testing`).",
            "channels"),
    Setting("CRONBOX_SMS_SENDER", "text", "unset", "the Kavenegar line number or Twilio From number.",
            "channels"),
    Setting("CRONBOX_KAVENEGAR_API_KEY", "secret", "unset", "Kavenegar's API key.", "channels"),
    Setting("CRONBOX_KAVENEGAR_URL", "url", "https://api.kavenegar.com", "Kavenegar's API address.",
            "channels"),
    Setting("CRONBOX_TWILIO_ACCOUNT_SID", "text", "unset", "Twilio's account SID.", "channels"),
    Setting("CRONBOX_TWILIO_AUTH_TOKEN", "secret", "unset", "Twilio's auth token.", "channels"),
    Setting("CRONBOX_TWILIO_URL", "url", "https://api.twilio.com", "Twilio's API address.", "channels"),
    Setting("CRONBOX_SMS_RATE", "rate", "unset",
            "a rate limit on SMS sends (e.g. `5/s`), shared by every worker through the database.",
            "channels"),
    Setting("CRONBOX_MAIL_RATE", "rate", "unset", "the same for e-mail.", "channels"),
    Setting("CRONBOX_CHANNEL_TIMEOUT", "seconds", "10", "each network step of a channel's send.", "channels"),
    Setting("CRONBOX_CHANNEL_PAUSE", "seconds", "900",
            "how long a channel waits after \"out of credit\" / \"bad credentials\" (`queue resume` ends it "
            "early).", "channels"),
    Setting("CRONBOX_MAIL_DRIVER", "choice", "smtp",
            "`smtp`, or `log` (development: nothing is sent, the attempt is recorded); `test` in tests (kept in "
            "memory: `cronbox.testing`).", "channels"),
    Setting("CRONBOX_WEBHOOK_DRIVER", "choice", "http",
            "`http`, or `test` in tests (a webhook alert is kept in memory, not posted: `cronbox.testing`).",
            "channels"),
    Setting("CRONBOX_SMTP_HOST", "text", "unset",
            "the SMTP server; without it (and the `smtp` driver) the e-mail channel pauses and alerts.",
            "channels"),
    Setting("CRONBOX_SMTP_PORT", "number", "587 (465 with `ssl`)", "the SMTP port.", "channels"),
    Setting("CRONBOX_SMTP_USER", "text", "unset", "the SMTP login.", "channels"),
    Setting("CRONBOX_SMTP_PASSWORD", "secret", "unset", "the SMTP password.", "channels"),
    Setting("CRONBOX_SMTP_SECURITY", "choice", "starttls", "`starttls`, `ssl` or `none`.", "channels"),
    Setting("CRONBOX_MAIL_FROM", "text", "unset", "the From address.", "channels"),
    # --- RabbitMQ -----------------------------------------------------------------------------------
    Setting("CRONBOX_AMQP_URL", "url", "unset",
            "the broker of `forward` targets, `forward_jobs`, `amqp consume` and `amqp work`: "
            "`amqp://user:password@host:5672/vhost`, or `amqps://` verified against the system CAs or "
            "`?cafile=ca.pem`.", "broker"),
    # --- console ------------------------------------------------------------------------------------
    Setting("CRONBOX_OPS_PASSWORD_HASH", "secret", "unset",
            "the console password's hash (`ops set-password --print-hash`; quote it in single quotes in "
            "`.env`); else `<instance>/ops-password`, written by the first-run page.", "console"),
    Setting("CRONBOX_OPS_SHOW_FILE_NAMES", "switch", "off",
            "`on`: the console's Files page unseals and shows file names (each shown name is audited).",
            "console"),
    # --- set by cronbox itself ----------------------------------------------------------------------
    Setting("CRONBOX_RUN_ACK", "path", "unset",
            "set by `artisan_via_cron.sh` for the run it starts: the file cronbox writes to show that what "
            "ran was its command line.", "internal", internal=True),
    Setting("CRONBOX_CRASH_AT", "text", "unset",
            "tests only: `<step>[:<n>]` makes the process exit abruptly at that step (fault injection).",
            "internal", internal=True),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}
assert len(BY_NAME) == len(SETTINGS), "a setting is listed twice"
