"""What GET /metrics shows, in the Prometheus text exposition format (version 0.0.4).

Every number comes from a read model the console and health already use (deliveries.status and
unfanned_count, jobstore.overview, groups.overview / budget_overview, heartbeat.recent / totals_since):
no SQL of its own. A scrape reads index ranges only:
pending and dead deliveries, live and failed jobs, the heartbeat rows of the last window.

Counters of handled work are not kept anywhere as monotonic totals (heartbeat rows are pruned after
7 days), so the "handled" and "runs" families are gauges: sums over the runs started in the last
CRONBOX_METRICS_WINDOW (default 1h). Read them as they are; rate() or increase() over them is wrong.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cronbox.outbox.core import clock
from cronbox.outbox.core.transactions import in_transaction
from cronbox.outbox.engine import heartbeat
from cronbox.outbox.events import deliveries
from cronbox.outbox.queue import groups, jobstore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_WINDOW = 3600.0
HANDLED = ("delivered", "retried", "dead", "jobs_done", "jobs_failed")  # heartbeat counts, in that order
RECENT_RUNS = 5  # how far back the last finished run of a command is looked for


@dataclass
class Family:
    name: str
    kind: str  # gauge (every family here: see the module's docstring)
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((labels, value))


# Every family GET /metrics shows: its labels and its HELP text ({span}: the window cronbox_handled and
# cronbox_runs sum over). The docs' metrics reference is generated from this table.
FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    "cronbox_outbox_pending": (("consumer",),
        "Deliveries not yet done per consumer: waiting, retrying or leased (due ones included)."),
    "cronbox_outbox_due": (("consumer",),
        "Pending deliveries whose time has come, per consumer."),
    "cronbox_outbox_oldest_due_age_seconds": (("consumer",),
        "Age of the oldest due delivery per consumer, from its due time; 0 when none is due."),
    "cronbox_outbox_dead": (("consumer",),
        "Dead deliveries per consumer (attempts used up; `outbox retry`)."),
    "cronbox_outbox_blocked_keys": (("consumer",),
        "Keys whose later deliveries wait behind a retrying or dead one, per consumer."),
    "cronbox_outbox_unfanned_events": ((),
        "Recorded events the relay has not yet fanned out to their consumers."),
    "cronbox_jobs": (("queue", "state"),
        "Jobs per queue and state: ready (due now, expired leases included), delayed (due later), "
        "reserved (leased by a worker), failed (tries used up or refused for good; `queue retry`)."),
    "cronbox_jobs_oldest_ready_age_seconds": (("queue",),
        "Age of the oldest ready job per queue, from its due time; 0 when none is ready."),
    "cronbox_group_limit": (("group",),
        "Concurrency limit per group, as its jobs declare it (absent for a group no job declares)."),
    "cronbox_group_slots_in_use": (("group",),
        "Slots held now per concurrency group (live leases: a killed holder's slot counts until its lease "
        "ends)."),
    "cronbox_group_waiting": (("group",),
        "Ready jobs (due or deferred) per concurrency group."),
    "cronbox_budget_used": (("scope", "name"),
        "Cost spent in the current window per budget (CRONBOX_QUEUE_BUDGETS, CRONBOX_GROUP_BUDGETS)."),
    "cronbox_budget_limit": (("scope", "name"),
        "Cost allowed per window per budget."),
    "cronbox_budget_window_seconds": (("scope", "name"),
        "The window of each budget."),
    "cronbox_handled": (("command", "outcome"),
        "Items handled by the runs started in {span}, per command and outcome (delivered, retried, dead: "
        "deliveries; jobs_done, jobs_failed: jobs). A sum of heartbeat rows over a sliding window, not a "
        "counter: do not rate() it."),
    "cronbox_runs": (("command", "outcome"),
        "Runs started in {span}, per command and how they ended (running: not finished, or killed)."),
    "cronbox_metrics_window_seconds": ((),
        "The window cronbox_handled and cronbox_runs sum over."),
    "cronbox_last_run_age_seconds": (("command",),
        "Seconds since the latest run of each command started: the tick always, other commands while they "
        "ran in {span} (then alert on cronbox_runs being absent)."),
    "cronbox_last_run_duration_seconds": (("command",),
        f"Wall time of the latest finished run of each command (among its last {RECENT_RUNS})."),
}


def _family(name: str, *, span: str = "") -> Family:
    """An empty family of FAMILIES, its HELP text said for this scrape's window."""
    return Family(name, "gauge", FAMILIES[name][1].replace("{span}", span))


def metrics_token(settings) -> str | None:
    """CRONBOX_METRICS_TOKEN, else CRONBOX_HEALTH_TOKEN: a scraper that may read /health in full may read this."""
    return settings.get("CRONBOX_METRICS_TOKEN") or settings.health_token


def window_seconds(settings) -> float:
    return settings.duration("CRONBOX_METRICS_WINDOW", DEFAULT_WINDOW, bounds=(60, 7 * 86400),
                             why="1m and 7d (heartbeats are kept 7 days)")


def collect(runtime, now: datetime | None = None) -> list[Family]:
    """Every family, read in one short transaction (so the numbers agree with each other). A database
    that does not answer raises SQLAlchemy's error: the caller says 503."""
    now = now or clock.utcnow()
    window = window_seconds(runtime.settings)
    queues = runtime.listed_queues()
    return in_transaction(runtime.sessions, lambda session: [
        *_outbox(session, runtime.consumers, now), *_jobs(session, queues, now),
        *_groups(session, runtime.jobs, runtime.settings, now), *_runs(session, now, window)])


def _age(now: datetime, then: datetime | None) -> float:
    return max((now - then).total_seconds(), 0.0) if then else 0.0


def _outbox(session, registry, now: datetime) -> list[Family]:
    per_consumer = deliveries.status(session, now)  # not overview(): its list of blocked keys is not shown here
    names = sorted(set(per_consumer) | set(registry.names()))  # registered consumers with nothing pending: zeros
    pending = _family("cronbox_outbox_pending")
    due = _family("cronbox_outbox_due")
    oldest = _family("cronbox_outbox_oldest_due_age_seconds")
    dead = _family("cronbox_outbox_dead")
    blocked = _family("cronbox_outbox_blocked_keys")
    for name in names:
        st = per_consumer.get(name) or deliveries.ConsumerStatus(name)
        pending.add(st.pending, consumer=name)
        due.add(st.due, consumer=name)
        oldest.add(round(_age(now, st.oldest_due_at), 3), consumer=name)
        dead.add(st.dead, consumer=name)
        blocked.add(st.blocked_keys, consumer=name)
    unfanned = _family("cronbox_outbox_unfanned_events")
    unfanned.add(deliveries.unfanned_count(session))
    return [pending, due, oldest, dead, blocked, unfanned]


def _jobs(session, queues: list[str], now: datetime) -> list[Family]:
    jobs = _family("cronbox_jobs")
    oldest = _family("cronbox_jobs_oldest_ready_age_seconds")
    for q in jobstore.overview(session, queues, now):  # the registered queues (zeros too), then any with jobs
        for state in ("ready", "delayed", "reserved", "failed"):
            jobs.add(getattr(q, state), queue=q.queue, state=state)
        oldest.add(round(_age(now, q.oldest_ready_at), 3), queue=q.queue)
    return [jobs, oldest]


def _groups(session, jobs, settings, now: datetime) -> list[Family]:
    limit = _family("cronbox_group_limit")
    in_use = _family("cronbox_group_slots_in_use")
    waiting = _family("cronbox_group_waiting")
    for use in groups.overview(session, jobs, now):
        if use.limit is not None:
            limit.add(use.limit, group=use.name)
        in_use.add(use.in_use, group=use.name)
        waiting.add(use.waiting, group=use.name)
    used = _family("cronbox_budget_used")
    budget_limit = _family("cronbox_budget_limit")
    budget_window = _family("cronbox_budget_window_seconds")
    for spent in groups.budget_overview(session, settings, now):
        b = spent.budget
        used.add(spent.used, scope=b.scope, name=b.name)
        budget_limit.add(b.limit, scope=b.scope, name=b.name)
        budget_window.add(b.per_seconds, scope=b.scope, name=b.name)
    return [limit, in_use, waiting, used, budget_limit, budget_window]


def _runs(session, now: datetime, window: float) -> list[Family]:
    since = now - timedelta(seconds=window)
    span = f"the last {window:g} s (CRONBOX_METRICS_WINDOW)"
    handled = _family("cronbox_handled", span=span)
    runs = _family("cronbox_runs", span=span)
    window_family = _family("cronbox_metrics_window_seconds")
    window_family.add(window)
    sums: dict[tuple[str, str], int] = {}
    seen = set()
    for command, outcome, count, *counts in heartbeat.totals_since(session, since):
        seen.add(command)
        runs.add(int(count), command=command, outcome=outcome)
        for name, value in zip(HANDLED, counts):
            sums[(command, name)] = sums.get((command, name), 0) + int(value or 0)
    for (command, name), value in sorted(sums.items()):
        handled.add(value, command=command, outcome=name)
    age = _family("cronbox_last_run_age_seconds", span=span)
    duration = _family("cronbox_last_run_duration_seconds")
    # The tick always (as health reads it); another command only when it ran in the window: looking up
    # one that never ran would read the started_at index back through all 7 days of rows (~27 ms for
    # 10k ticks on MariaDB 10.11), on every scrape.
    for command in sorted({"tick"} | seen):
        latest = heartbeat.recent(session, command, RECENT_RUNS)
        if not latest:
            continue  # never ran (or not in the 7 days kept): no line rather than a made-up one
        age.add(round(_age(now, latest[0].started_at), 3), command=command)
        finished = next((r for r in latest if r.finished_at is not None), None)
        if finished is not None:
            duration.add(round(_age(finished.finished_at, finished.started_at), 3), command=command)
    return [handled, runs, window_family, age, duration]


# ---- the text format ------------------------------------------------------------------

def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(families: list[Family]) -> str:
    """The exposition text: HELP and TYPE for every family (also one with no samples yet), then its samples."""
    lines = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            label_text = ",".join(f'{key}="{_escape_label(v)}"' for key, v in labels.items())
            lines.append(f"{family.name}{{{label_text}}} {_number(value)}" if labels else
                         f"{family.name} {_number(value)}")
    return "\n".join(lines) + "\n"
