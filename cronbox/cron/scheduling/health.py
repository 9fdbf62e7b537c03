"""Health: is cron running the tick, is work flowing, is the host fit? ok / warn / fail per check.

Thresholds follow CRONBOX_CRON_INTERVAL (minutes between cron runs), so a host
whose cron only runs every 15 minutes is not reported as failing all the time.
Used by `health [--json]`, `GET /health` and the scheduled check that alerts
the operator (at most once an hour per problem, and once when it clears).
"""
from __future__ import annotations

import os
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select, text
from sqlalchemy.exc import SQLAlchemyError

from cronbox.cron.scheduling.models import AlertState
from cronbox.outbox.core import clock, sqlite_files
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.logs import log_text
from cronbox.outbox.core.memlimit import DEFAULT_LVE_LIST, DEFAULT_ROOT, process_limit
from cronbox.outbox.core.sql import insert_ignore
from cronbox.outbox.core.text import NAME_MAX, clean_text
from cronbox.outbox.engine import heartbeat
from cronbox.outbox.engine.models import Heartbeat
from cronbox.outbox.events import deliveries
from cronbox.outbox.events.forward import is_forward
from cronbox.outbox.queue import jobstore, pauses

OK, WARN, FAIL = "ok", "warn", "fail"
ORDER = {OK: 0, WARN: 1, FAIL: 2}
ALERT_EVERY = timedelta(hours=1)


@dataclass
class Check:
    name: str
    status: str
    detail: str
    value: float | int | str | None = None


@dataclass
class Report:
    status: str
    checked_at: datetime
    checks: list[Check]
    # What the work checks read, for a caller that shows it too (the console's overview) without
    # counting every failed job a second time. Not part of as_json().
    queues: dict = field(default_factory=dict, repr=False)

    def as_json(self) -> dict:
        return {"status": self.status, "checked_at": self.checked_at.isoformat() + "Z",
                "checks": [asdict(c) for c in self.checks]}


def _grade(value: float, warn: float, fail: float) -> str:
    return FAIL if value > fail else WARN if value > warn else OK


def run_checks(runtime, *, backlog: bool = True) -> Report:
    """Every check; with `backlog=False` the database's ping, the tick's and consumers' heartbeats and
    the host's files only, leaving out the counts of deliveries and jobs (what makes a report cost
    hundreds of milliseconds on a big backlog), for an answer given to anyone (cronbox.web.health)."""
    settings = runtime.settings
    interval = settings.cron_interval * 60
    checks: list[Check] = []
    queues: dict = {}
    now = clock.utcnow()
    try:
        started = time.perf_counter()
        with runtime.sessions() as session:
            session.execute(text("SELECT 1"))
            latency = (time.perf_counter() - started) * 1000
            checks.append(Check("database", _grade(latency, 250, 2000), f"reachable in {latency:.0f} ms",
                                round(latency, 1)))
            checks.append(_tick_check(session, now, interval))
            checks += _consumer_checks(session, now)
            if backlog:
                work, queues = _backlog_checks(session, now, interval)
                checks += work
                checks += _forward_checks(session, runtime, now)
                checks += _payload_key_checks(session, runtime)
                checks += _payload_sealing_checks(session, runtime)
    except Exception as exc:
        checks.append(Check("database", FAIL, f"unreachable: {type(exc).__name__}"))
    checks.append(_disk_check(settings.instance))
    checks.append(_instance_check(settings.instance))
    checks += _database_file_checks(settings.database_url)
    checks += _key_checks(settings)
    checks += _memory_checks(settings)
    return Report(worst(checks), now, checks, queues)


def backlog_status(runtime) -> str:
    """The worst grade of the backlog checks alone (run_checks' counts), for a caller that keeps it
    a while; an unreachable database is the ping's failure to report, not this one's."""
    interval = runtime.settings.cron_interval * 60
    with runtime.sessions() as session:
        now = clock.utcnow()
        checks, _ = _backlog_checks(session, now, interval)
        checks += _forward_checks(session, runtime, now)
    return worst(checks)


def worst(checks: list[Check]) -> str:
    return max((c.status for c in checks), key=ORDER.__getitem__, default=OK)


def _tick_check(session, now: datetime, interval: float) -> Check:
    last = session.execute(select(Heartbeat.started_at, Heartbeat.outcome).where(Heartbeat.command == "tick")
                           .order_by(Heartbeat.started_at.desc()).limit(1)).first()
    if last is None:
        return Check("tick", FAIL, "no tick has run yet: is the cron line installed?")
    age = (now - last.started_at).total_seconds()
    # One interval late is normal (the tick runs at the end of it); three is a missed run or more.
    grade = _grade(age, interval + 90, 3 * interval + 90)
    if grade == OK and last.outcome in ("error", "lock-lost", "lost-connection"):
        grade = WARN
    return Check("tick", grade, f"last tick {age:.0f}s ago ({last.outcome})", round(age))


def _backlog_checks(session, now: datetime, interval: float) -> tuple[list[Check], dict]:
    checks = []
    per_consumer = deliveries.status(session, now)
    due = sum(s.due for s in per_consumer.values())
    dead = sum(s.dead for s in per_consumer.values())
    blocked = sum(s.blocked_keys for s in per_consumer.values())
    oldest = min((s.oldest_due_at for s in per_consumer.values() if s.oldest_due_at), default=None)
    oldest_age = (now - oldest).total_seconds() if oldest else 0
    grade = _grade(oldest_age, 2 * interval + 300, 6 * interval + 1800)
    checks.append(Check("outbox.backlog", grade, f"{due} due, oldest {oldest_age:.0f}s", due))
    checks.append(Check("outbox.dead", WARN if dead else OK, f"{dead} dead deliveries", dead))
    checks.append(Check("outbox.blocked", WARN if blocked else OK, f"{blocked} blocked keys", blocked))

    queues = jobstore.status(session, now)
    for name, q in sorted(queues.items()):
        age = (now - q.oldest_ready_at).total_seconds() if q.oldest_ready_at else 0
        grade = _grade(age, 2 * interval + 300, 6 * interval + 1800)
        checks.append(Check(f"queue.{name}", grade, f"{q.ready} ready, oldest {age:.0f}s, {q.delayed} delayed, "
                                                   f"{q.reserved} reserved", q.ready))
        checks.append(Check(f"queue.{name}.failed", WARN if q.failed else OK, f"{q.failed} failed jobs", q.failed))
    # A warning, not a failure: the pause already alerted the operator and ends by itself.
    for pause in pauses.active(session, now):
        left = (pause.paused_until - now).total_seconds()
        checks.append(Check(f"channel.{pause.channel}", WARN, f"paused for {left:.0f}s more: {pause.reason} "
                                                             f"(lift with `queue resume {pause.channel}`)", round(left)))
    return checks, queues


CONSUME = "amqp consume"  # the heartbeat command of a broker consumer run (cron/commands/amqp.py)
# Runs fed by the broker, each with a heartbeat row per run: (its command, its checks' prefix, what it does).
BROKER_RUNS = ((CONSUME, "consumer", "consuming"), ("amqp work", "broker-worker", "running the jobs of"))


def _consumer_checks(session, now: datetime) -> list[Check]:
    """Per queue served by `amqp consume` (and per queue list of `amqp work`), its latest run:
    beating (ok), silent for longer than STALE_BEATS beats while "running" (fail: the process died
    without finishing its row, e.g. SIGKILL or out of memory), ended with an error (warn). No such
    runs: no check."""
    stale = heartbeat.BEAT_SECONDS * heartbeat.STALE_BEATS
    checks = []
    for command, prefix, doing in BROKER_RUNS:
        for run in heartbeat.latest_per_detail(session, command):
            queue = run.detail or "?"
            name = f"{prefix}.{queue}"
            if run.outcome == "running":
                age = (now - (run.beat_at or run.started_at)).total_seconds()
                if age > stale:
                    checks.append(Check(name, FAIL, f"{command} on {queue}: no beat for {age:.0f}s from pid {run.pid} "
                                                    f"on {run.host} (it died without finishing: killed, out of memory?)",
                                        round(age)))
                else:
                    checks.append(Check(name, OK, f"{doing} {queue} (pid {run.pid} on {run.host}), beat {age:.0f}s ago",
                                        round(age)))
                continue
            age = (now - (run.finished_at or run.started_at)).total_seconds()
            if run.outcome == "error" or run.error:
                checks.append(Check(name, WARN, f"{command} on {queue} (pid {run.pid} on {run.host}) ended "
                                                f"{age:.0f}s ago with an error: {log_text(run.error or run.outcome, 200)}",
                                    round(age)))
            else:
                checks.append(Check(name, OK, f"{command} on {queue} ended {age:.0f}s ago ({run.outcome})", round(age)))
    return checks


FORWARD_WARN, FORWARD_FAIL = 600.0, 3600.0  # seconds (CRONBOX_FORWARD_WARN_AFTER, _FAIL_AFTER)


def forward_thresholds(settings) -> tuple[float, float]:
    """How long a forward target may fail before health warns, then fails (SettingsError naming the
    setting if one is not a duration from 1 s to 30 days)."""
    bounds, why = (1, 30 * 86400), "1s and 30d"
    return (settings.duration("CRONBOX_FORWARD_WARN_AFTER", FORWARD_WARN, bounds=bounds, why=why),
            settings.duration("CRONBOX_FORWARD_FAIL_AFTER", FORWARD_FAIL, bounds=bounds, why=why))


def failing_forwards(session, runtime, now: datetime) -> list[tuple[str, deliveries.Failing, float]]:
    """(grade, failing, seconds) per forward target of this process whose deliveries have been failing
    (the broker unreachable, the exchange missing, ...) for longer than the warning threshold."""
    warn, fail = forward_thresholds(runtime.settings)
    names = [c.name for c in runtime.consumers.all() if is_forward(c)]
    out = []
    for failing in deliveries.failing(session, names):
        seconds = max((now - failing.since).total_seconds(), 0)
        if seconds > warn:
            out.append((FAIL if seconds > fail else WARN, failing, seconds))
    return out


def describe_failing(failing: deliveries.Failing, seconds: float) -> str:
    """One line, no secrets: the broker's address is stored without its password (BrokerAddress)."""
    error = clean_text(log_text(failing.last_error or "?", 200), 200)
    return (f"forward target {clean_text(failing.consumer, NAME_MAX)!r} failing for {seconds / 60:.0f} min "
            f"({failing.count} deliveries waiting): {error}")


def forward_warning(runtime) -> str | None:
    """The tick's one stderr line when forwarding has been failing past the warning threshold (the
    tick itself exits 0: its other work went on), naming the longest-failing target; None if all is well."""
    try:
        with runtime.sessions() as session:
            found = failing_forwards(session, runtime, clock.utcnow())
    except SettingsError as exc:
        return f"warning: {exc}; forwarding not checked"
    except SQLAlchemyError:
        return None  # the tick reported its database trouble already
    if not found:
        return None
    _grade_, failing, seconds = max(found, key=lambda f: f[2])
    more = f" (and {len(found) - 1} more targets)" if len(found) > 1 else ""
    return f"warning: {describe_failing(failing, seconds)}{more}; see `python -m cronbox health`"


def _forward_checks(session, runtime, now: datetime) -> list[Check]:
    """Per forward target: its deliveries failing for longer than CRONBOX_FORWARD_WARN_AFTER (10 min)
    warns, longer than CRONBOX_FORWARD_FAIL_AFTER (1 h) fails. Targets that deliver: no check."""
    try:
        found = failing_forwards(session, runtime, now)
    except SettingsError as exc:
        return [Check("forward", WARN, f"{exc}; forwarding not checked")]
    return [Check(f"forward.{f.consumer}", grade, describe_failing(f, seconds), round(seconds))
            for grade, f, seconds in found]


def _payload_key_checks(session, runtime) -> list[Check]:
    """Sealed payloads waiting to run whose master key is not in the key folder: a FAIL now, before a
    worker fails each of them on it (storage.payload_keys)."""
    from cronbox.storage.payload_keys import waiting_key_ids

    used = waiting_key_ids(session)
    if not used:
        return []
    sealer = runtime.sealer()
    if sealer is None:
        return [Check("payload_keys", FAIL, f"sealed payloads wait under {len(used)} key(s), but no key vault is "
                                            "configured here")]
    missing = sorted(used - sealer.keys.known())
    if missing:
        return [Check("payload_keys", FAIL, f"sealed payloads wait under master key(s) missing from the key folder: "
                                            f"{', '.join(missing)}; restore them from your key backup", len(missing))]
    return [Check("payload_keys", OK, f"every waiting sealed payload's key is present ({len(used)} key(s))", 0)]


def _payload_sealing_checks(session, runtime) -> list[Check]:
    """The payloads sealed by default (the channel jobs: PHI) stored unsealed: all of them from now on
    when the key vault cannot be used (a WARN; a FAIL under CRONBOX_SEAL_PAYLOADS=all), and those
    waiting that were dispatched where no key vault was configured or before the upgrade (a WARN)."""
    import cronbox.outbox.channels  # noqa: F401  (the channel jobs: the ones sealed by default)
    from cronbox.outbox.core.sealing import BY_DEFAULT
    from cronbox.outbox.engine.registry import DEFAULT
    from cronbox.storage.payload_keys import unsealed_by_default, vault_problem

    problem = vault_problem(runtime.settings)
    if problem is not None:
        grade = FAIL if runtime.settings.seal_payloads == "all" else WARN
        return [Check("payload_sealing", grade, f"PHI payloads are stored unsealed (the channel jobs'; sealed=True "
                                                f"ones are refused): the key vault is not usable: {problem}")]
    names = {h.name for h in (*runtime.jobs.all(), *DEFAULT.jobs.all()) if h.sealed == BY_DEFAULT}
    count = unsealed_by_default(session, names)
    if count:
        return [Check("payload_sealing", WARN, f"{count} channel job payload(s) (PHI) wait unsealed: dispatched where "
                                               "no key vault was configured, or before sealing; `python -m cronbox "
                                               "storage seal-payloads` seals them", count)]
    return [Check("payload_sealing", OK, "the key vault is usable: the channel jobs' payloads are sealed", 0)]


def _disk_check(folder) -> Check:
    try:
        usage = shutil.disk_usage(folder)
    except OSError as exc:
        return Check("disk", FAIL, f"cannot read disk usage of the instance folder: {exc.strerror}")
    free_mb = usage.free / 2**20
    share = usage.free / usage.total if usage.total else 0
    status = FAIL if free_mb < 200 or share < 0.02 else WARN if free_mb < 1024 or share < 0.10 else OK
    return Check("disk", status, f"{free_mb:,.0f} MiB free ({share:.0%})", round(free_mb))


def _instance_check(folder) -> Check:
    try:
        mode = os.stat(folder).st_mode
    except OSError:
        return Check("instance", FAIL, "instance folder missing")
    if mode & stat.S_IRWXO:
        return Check("instance", FAIL, f"instance folder {folder} is accessible to other users (mode "
                                       f"{oct(mode & 0o777)}): chmod 700 {folder}")
    return Check("instance", OK, f"mode {oct(mode & 0o777)}")


def _database_file_checks(url: str) -> list[Check]:
    """A SQLite database (cronbox's own or the host app's it shares) holds job payloads in clear: its
    file, -wal/-shm/-journal and folder must be closed to the group and others. Names and modes only."""
    database = sqlite_files.database_path(url)
    if database is None:
        return []
    open_ = sqlite_files.open_to_others(database)
    if not open_:
        return [Check("database_file", OK, "private")]
    files = [str(path) for path, _ in open_ if path != database.parent]
    fixes = ([f"chmod 600 {' '.join(files)} (or run migrate)"] if files else []) + (
        [f"chmod 700 {database.parent}"] if any(path == database.parent for path, _ in open_) else [])
    modes = ", ".join(f"{path} {mode:#o}" for path, mode in open_)
    return [Check("database_file", FAIL, f"open to other users: {modes}; fix: {'; '.join(fixes)}")]


MEMORY_WARN, MEMORY_FAIL = 80.0, 95.0  # per cent of the limit in use (CRONBOX_MEMORY_WARN, _FAIL)


def _memory_checks(settings) -> list[Check]:
    """Headroom under the memory limit the kernel puts on this process (outbox.core.memlimit's
    process_limit, the one admission uses): its cgroup's, or its CloudLinux LVE's where
    /proc/lve/list is readable (either way the whole account's web and cron processes together),
    the tighter of the two. No limit known: no check."""
    try:
        warn, fail = (_percent(settings, name, default) for name, default in
                      (("CRONBOX_MEMORY_WARN", MEMORY_WARN), ("CRONBOX_MEMORY_FAIL", MEMORY_FAIL)))
    except ValueError as exc:
        return [Check("memory", WARN, str(exc))]
    found = process_limit(settings.get("CRONBOX_CGROUP_ROOT") or DEFAULT_ROOT,
                          settings.get("CRONBOX_LVE_LIST") or DEFAULT_LVE_LIST)
    if found is None:
        return []
    share = found.share_used * 100
    mib = 2 ** 20
    return [Check("memory", _grade(share, warn, fail),
                  f"{found.used / mib:,.0f} of {found.limit / mib:,.0f} MiB in use ({share:.0f}%), "
                  f"{found.headroom / mib:,.0f} MiB headroom ({found.source})", round(found.headroom / mib))]


def _percent(settings, name: str, default: float) -> float:
    raw = settings.get(name)
    if raw is None:
        return default
    try:
        value = float(raw.rstrip("% "))
    except ValueError:
        value = -1.0
    if not 0 < value <= 100:
        raise ValueError(f"{name}={raw!r} must be a percentage between 0 and 100; memory not checked")
    return value


def _key_checks(settings) -> list[Check]:
    """Master key files (sealed storage): present, readable, and readable by nobody else."""
    folder = settings.key_folder
    if not folder.is_dir():
        return []
    checks = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.startswith("."):
            continue
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            checks.append(Check(f"key.{path.name}", FAIL,
                                f"readable by others (mode {oct(mode & 0o777)}): chmod 600 {path}"))
        elif not os.access(path, os.R_OK):
            checks.append(Check(f"key.{path.name}", FAIL, "not readable by this user"))
        else:
            checks.append(Check(f"key.{path.name}", OK, "private"))
    return checks


def alert_on(runtime, report: Report) -> list[str]:
    """Tell the operator about failing checks (at most once an hour each) and about recoveries.
    Returns what was sent ("fail:<check>", "ok:<check>")."""
    from cronbox.outbox.channels.jobs import admin_alert  # imported here: it registers the channel jobs

    now = report.checked_at
    sent: list[str] = []
    with runtime.sessions.begin() as session:
        states = {s.problem: s for s in session.scalars(select(AlertState))}
        for check in report.checks:
            state = states.get(check.name)
            if check.status == FAIL:
                if state is None:
                    insert_ignore(session, AlertState.__table__, {"problem": check.name, "failing": False,
                                                                  "detail": None, "since": now})
                    state = session.get(AlertState, check.name)
                if not state.failing:
                    state.failing, state.since, state.last_alerted_at = True, now, None
                if state.last_alerted_at is None or now - state.last_alerted_at >= ALERT_EVERY:
                    state.last_alerted_at, state.detail = now, check.detail[:500]
                    admin_alert(session, runtime.settings, key=f"health:{check.name}:{now:%Y%m%d%H%M}",
                                subject=f"health check {check.name} failing",
                                body=f"{check.name}: {check.detail} (since {state.since:%Y-%m-%d %H:%M} UTC)",
                                check=check.name, status=check.status)
                    sent.append(f"fail:{check.name}")
            elif state is not None and state.failing:
                state.failing, state.detail = False, check.detail[:500]
                admin_alert(session, runtime.settings, key=f"health:{check.name}:ok:{now:%Y%m%d%H%M}",
                            subject=f"health check {check.name} recovered",
                            body=f"{check.name} is {check.status} again: {check.detail}",
                            check=check.name, status=check.status, recovery=True)
                sent.append(f"ok:{check.name}")
    return sent

