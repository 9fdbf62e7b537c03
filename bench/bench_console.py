"""Operator console benchmark: GET of every /ops/ page with N rows in each table it lists.

    .venv/bin/python -m bench.bench_console [--mysql mysql+pymysql://root:@127.0.0.1/test] [--rows 100000] [--repeat 20]

On SQLite and MariaDB, each in a fresh database (MariaDB: `cronbox_bench_<random>`,
dropped afterwards), migrated, then filled in batches with --rows rows per big
table: file audit, jobs, events + deliveries, heartbeats, one-off runs, operator
actions and grants (with the files their foreign key needs). Each page is fetched
through Flask's test client with a logged-in operator: one warm-up, then --repeat
timed GETs; median and p95 are reported, and every answer must be a 200 with its
list filled. The SQL each page runs is captured once; on MariaDB the SELECTs on
the big tables are EXPLAINed (printed, and summarised in the notes), and a page
slower than 100 ms median gets its slowest statement and plan printed.
Rewrites the "Operator console pages" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from datetime import datetime, timedelta
from urllib.parse import urlencode

from sqlalchemy import event, insert, select
from sqlalchemy.engine import Engine

from bench.bench_outbox import Target
from bench.report import write_section
from cronbox.cron.operator.models import OperatorAction
from cronbox.cron.scheduling.models import OnceRequest
from cronbox.outbox.core import clock
from cronbox.outbox.engine.models import Heartbeat
from cronbox.outbox.events.models import Delivery, OutboxEvent
from cronbox.outbox.queue.models import Job
from cronbox.storage.models import AuditEntry, Grant, SealedFile

BATCH = 5000
SLOW_MS = 100.0
QUEUES = ("default", "sms", "mail")
CONSUMERS = ("mailer", "sms", "ledger")
SUBJECTS = 1000
FILES = 5000
BIG_TABLES = ("cronbox_file_audit", "cronbox_jobs", "cronbox_deliveries", "cronbox_events", "cronbox_heartbeats",
              "cronbox_once_requests", "cronbox_ops_actions", "cronbox_grants", "cronbox_files")


# ---- data ---------------------------------------------------------------------------------------

def hex_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def bulk(engine: Engine, table, rows) -> int:
    """Insert an iterable of dicts, `BATCH` rows per executemany and per transaction."""
    count, batch = 0, []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH:
            with engine.begin() as c:
                c.execute(insert(table), batch)
            count, batch = count + len(batch), []
    if batch:
        with engine.begin() as c:
            c.execute(insert(table), batch)
        count += len(batch)
    return count


def spread(now: datetime, i: int, n: int, days: float) -> datetime:
    """Row i of n, oldest first, evenly over the last `days` days (so id order is time order)."""
    return now - timedelta(days=days) + timedelta(seconds=days * 86400 * (i + 1) / (n + 1))


def fill(t: Target, n: int, now: datetime) -> dict:
    """The big tables, N rows each (files: a few thousand, for the grants' and audit's file ids)."""
    rng = random.Random(20261130)
    engine = t.runtime.engine
    subjects = [f"patient:{rng.randrange(10**6)}" for _ in range(SUBJECTS)]
    file_ids = [hex_id(rng) for _ in range(FILES)]
    counts = {}

    counts["cronbox_files"] = bulk(engine, SealedFile.__table__, (
        {"id": fid, "owner": f"user:{i % 50}", "algorithm": "aes-256-gcm", "key_id": "k1",
         "wrapped_key": b"\x00" * 60, "meta": b"\x00" * 64, "size": 100_000 + i, "sealed_size": 100_100 + i,
         "created_at": spread(now, i, FILES, 400)} for i, fid in enumerate(file_ids)))

    def audit_rows():
        for i in range(n):
            action = rng.choices(("put", "grant", "revoke", "issue", "redeem", "serve", "verify"),
                                 (3, 8, 1, 15, 40, 30, 3))[0]
            if action == "redeem":
                outcome = rng.choices(("granted", "expired", "revoked", "bad-token", "used-up", "not-found"),
                                      (80, 8, 3, 5, 3, 1))[0]
                status = 200 if outcome == "granted" else (404 if outcome in ("bad-token", "not-found") else 410)
            else:
                outcome, status = "ok", None
            served = action == "serve"
            yield {"at": spread(now, i, n, 365), "action": action, "outcome": outcome, "status": status,
                   "file_id": rng.choice(file_ids), "grant_id": hex_id(rng) if action != "put" else None,
                   "subject": rng.choice(subjects), "jti_hash": hex_id(rng) if action == "redeem" else None,
                   "range_start": 0 if served else None, "range_end": 99_999 if served else None,
                   "bytes_sent": 100_000 if served else None, "client_ip": f"203.0.113.{i % 250}",
                   "user_agent": "Mozilla/5.0 (bench)", "detail": None}
    counts["cronbox_file_audit"] = bulk(engine, AuditEntry.__table__, audit_rows())

    def grant_rows():
        for i in range(n):
            created = spread(now, i, n, 120)
            yield {"id": hex_id(rng), "file_id": rng.choice(file_ids), "subject": rng.choice(subjects),
                   "created_at": created, "expires_at": created + timedelta(days=7),
                   "max_uses": rng.choice((None, 1, 5)), "uses": rng.randrange(3),
                   "revoked_at": created + timedelta(hours=1) if rng.random() < 0.05 else None}
    counts["cronbox_grants"] = bulk(engine, Grant.__table__, grant_rows())

    def job_rows():
        for i in range(n):
            created = spread(now, i, n, 30)
            failed = rng.random() < 0.5
            yield {"queue": rng.choice(QUEUES), "handler": rng.choice(("sms.send", "mail.send", "report.build")),
                   "payload": json.dumps({"to": f"+1555{i:07d}"}), "status": "failed" if failed else "done",
                   "attempts": 3 if failed else 1, "available_at": None, "claim_token": None, "unique_key": None,
                   "retry_until": None, "trace_id": hex_id(rng), "created_at": created,
                   "reserved_at": created + timedelta(seconds=2), "finished_at": created + timedelta(seconds=3),
                   "last_error": "gateway down: 503 Service Unavailable" if failed else None,
                   "error_class": "RuntimeError" if failed else None,
                   "traceback": "Traceback (most recent call last):\n  ...\nRuntimeError: gateway down" if failed
                   else None}
    counts["cronbox_jobs"] = bulk(engine, Job.__table__, job_rows())

    # One delivery per event, its consumer one of three; two thirds of the events carry a key.
    dead_flags = [rng.random() < 0.5 for _ in range(n)]
    keys = [f"order:{rng.randrange(20_000)}" if rng.random() < 2 / 3 else None for _ in range(n)]

    def event_rows():
        for i in range(n):
            created = spread(now, i, n, 30)
            yield {"type": "order.paid", "key": keys[i], "payload": json.dumps({"order": i, "amount": 1999}),
                   "trace_id": hex_id(rng), "created_at": created, "available_at": created,
                   "fanned_out_at": created + timedelta(seconds=1)}
    counts["cronbox_events"] = bulk(engine, OutboxEvent.__table__, event_rows())
    with engine.connect() as c:
        first_event = c.scalar(select(OutboxEvent.id).order_by(OutboxEvent.id).limit(1))

    def delivery_rows():
        for i in range(n):
            created = spread(now, i, n, 30)
            dead = dead_flags[i]
            yield {"event_id": first_event + i, "consumer": CONSUMERS[i % 3], "key": keys[i],
                   "status": "dead" if dead else "done", "attempts": 8 if dead else 1,
                   "next_attempt_at": created + timedelta(hours=6 if dead else 0, seconds=1),
                   "claim_token": None, "lease_until": None,
                   "last_error": "RuntimeError: smtp refused (550 mailbox unavailable)" if dead else None,
                   "created_at": created + timedelta(seconds=1),
                   "finished_at": created + timedelta(hours=6 if dead else 0, seconds=2)}
    counts["cronbox_deliveries"] = bulk(engine, Delivery.__table__, delivery_rows())

    def heartbeat_rows():
        # Per-minute ticks going back from now: the last 1,440 are the chart's 24 hours.
        for i in range(n):
            started = now.replace(second=5, microsecond=0) - timedelta(minutes=n - 1 - i)
            outcome = "error" if rng.random() < 0.01 else "ok"
            yield {"command": "tick", "host": "web1", "pid": 1000 + i % 30000, "started_at": started,
                   "finished_at": started + timedelta(seconds=rng.uniform(0.5, 40)), "outcome": outcome,
                   "delivered": rng.randrange(40), "retried": rng.randrange(3), "dead": 0,
                   "jobs_done": rng.randrange(20), "jobs_failed": rng.randrange(2), "backlog": rng.randrange(200),
                   "peak_rss_kb": 70_000 + rng.randrange(8000),
                   "error": "OperationalError: lost connection" if outcome == "error" else None}
    counts["cronbox_heartbeats"] = bulk(engine, Heartbeat.__table__, heartbeat_rows())

    def once_rows():
        commands = (["migrate"], ["schedule", "run", "cronbox.health"], ["storage", "sweep"], ["queue", "flush"])
        for i in range(n):
            requested = spread(now, i, n, 365)
            status = rng.choices(("done", "failed", "refused"), (90, 7, 3))[0]
            yield {"argv": json.dumps(rng.choice(commands)), "source": rng.choice(("cli", "file:run.cmd",
                                                                                     "console:operator")),
                   "status": status, "reason": "not allowed" if status == "refused" else None,
                   "exit_code": None if status == "refused" else (0 if status == "done" else 1),
                   "output": "migrated schema from 0004_storage to 0005_console\n" * 3,
                   "requested_at": requested, "started_at": requested + timedelta(seconds=30),
                   "finished_at": requested + timedelta(seconds=32)}
    counts["cronbox_once_requests"] = bulk(engine, OnceRequest.__table__, once_rows())

    def action_rows():
        actions = ("login", "logout", "outbox.retry", "outbox.skip", "queue.retry", "queue.forget", "files.revoke",
                   "once.add", "schedule.run")
        for i in range(n):
            yield {"at": spread(now, i, n, 365), "operator": "operator", "action": rng.choice(actions),
                   "target": f"#{rng.randrange(10**6)}", "outcome": rng.choices(("ok", "refused"), (95, 5))[0],
                   "detail": None, "client_ip": f"198.51.100.{i % 250}"}
    counts["cronbox_ops_actions"] = bulk(engine, OperatorAction.__table__, action_rows())
    return counts


# ---- what to fetch ------------------------------------------------------------------------------

def cursor_text(*values) -> str:
    """outbox/core/paging.py's cursor: the key values joined by '~', datetimes in ISO format."""
    return "~".join(v.isoformat() if isinstance(v, datetime) else str(v) for v in values)


def pages(t: Target, n: int) -> list[tuple[str, str, str | None]]:
    """(label, path, text the answer must not contain) for each page measured."""
    D, A, J, G = Delivery.__table__, AuditEntry.__table__, Job.__table__, Grant.__table__
    with t.runtime.engine.connect() as c:
        deep_dead = c.execute(select(D.c.next_attempt_at, D.c.id).where(D.c.status == "dead")
                              .order_by(D.c.next_attempt_at.desc(), D.c.id.desc()).offset(n // 4).limit(1)).one()
        deep_failed = c.execute(select(J.c.finished_at, J.c.id).where(J.c.status == "failed")
                                .order_by(J.c.finished_at.desc(), J.c.id.desc()).offset(n // 4).limit(1)).one()
        deep_grant = c.execute(select(G.c.created_at, G.c.id).order_by(G.c.created_at.desc(), G.c.id.desc())
                               .offset(n // 2).limit(1)).one()
        ids = list(c.scalars(select(A.c.id).order_by(A.c.id)))
        mid_id = ids[len(ids) // 2]
        # A subject and a file picked from a row in the middle: a typical filter, not the busiest value.
        subject, file_id = c.execute(select(A.c.subject, A.c.file_id).where(A.c.id == mid_id)).one()
    no_audit, no_failed, no_dead = "No audit entries", "No failed jobs", "No dead deliveries"
    return [
        ("overview (health, depths, 24 h chart)", "/ops/", "No tick has run yet"),
        ("outbox", "/ops/outbox", no_dead),
        (f"outbox, dead page ~{n // 4:,} rows deep", "/ops/outbox?" + urlencode({"after": cursor_text(*deep_dead)}),
         no_dead),
        ("queues", "/ops/queues", no_failed),
        ("queues ?queue=sms", "/ops/queues?queue=sms", no_failed),
        (f"queues, failed page ~{n // 4:,} rows deep", "/ops/queues?" + urlencode({"after": cursor_text(*deep_failed)}),
         no_failed),
        ("schedule", "/ops/schedule", "No scheduled tasks"),
        ("once", "/ops/once", "No one-off runs"),
        ("files", "/ops/files", no_audit),
        ("files ?subject=", "/ops/files?" + urlencode({"subject": subject}), no_audit),
        ("files ?outcome=expired", "/ops/files?outcome=expired", no_audit),
        ("files ?file=", f"/ops/files?file={file_id}", no_audit),
        (f"files, audit page after id {mid_id:,}", f"/ops/files?after={mid_id}", no_audit),
        (f"files, grants page ~{n // 2:,} rows deep",
         "/ops/files?" + urlencode({"grants_after": cursor_text(*deep_grant)}), "No grants"),
        ("activity", "/ops/activity", None),
    ]


# ---- the SQL a page runs --------------------------------------------------------------------------

class Capture:
    """Statements the app's engine runs, with their parameters and times, while `on`."""

    def __init__(self, engine: Engine):
        self.on = False
        self.statements: list[tuple[str, object, float]] = []
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn, cursor, statement, parameters, context, executemany):
        conn.info["bench_started"] = time.perf_counter()

    def _after(self, conn, cursor, statement, parameters, context, executemany):
        if self.on:
            took = (time.perf_counter() - conn.info.pop("bench_started")) * 1000
            self.statements.append((statement, parameters, took))


def explain(t: Target, statement: str, parameters) -> tuple[float, list[dict]]:
    """The statement's own time (run again, rows fetched, best of 2) and its plan.

    MariaDB: ANALYZE, which runs it and adds the rows actually read (r_rows) to EXPLAIN's estimate.
    """
    with t.runtime.engine.connect() as c:
        took = []
        for _ in range(2):
            started = time.perf_counter()
            c.exec_driver_sql(statement, parameters).fetchall()
            took.append((time.perf_counter() - started) * 1000)
        if c.dialect.name == "sqlite":
            plan = c.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)
        else:
            try:
                plan = c.exec_driver_sql("ANALYZE " + statement, parameters)
            except Exception:  # MySQL has no ANALYZE <select>
                c.rollback()
                plan = c.exec_driver_sql("EXPLAIN " + statement, parameters)
        return min(took), [dict(row._mapping) for row in plan]


def plan_line(row: dict) -> str:
    if "detail" in row:  # SQLite
        return row["detail"]
    read = f" read={float(row['r_rows']):,.0f}" if row.get("r_rows") is not None else ""
    return (f"{row['table']}: type={row['type']} key={row['key']} rows~{row['rows']}{read}"
            + (f" ({row['Extra']})" if row.get("Extra") else ""))


def shape(statement: str) -> str:
    """A few words for a statement: its table and what makes it cost (aggregate, correlated subquery, page)."""
    s = " ".join(statement.split())
    low = s.lower()
    table = low.split(" from ", 1)[1].split()[0].strip('`"') if " from " in low else "?"
    words = [table.removeprefix("cronbox_")]
    if "group by" in low:
        words.append("GROUP BY " + low.rsplit("group by", 1)[1].split()[0].split(".")[-1].strip('`"'))
    if low.count("select") > 1:
        words.append("with correlated subquery")
    if "limit" in low and "group by" not in low:
        words.append("page")
    return " ".join(words)


def on_big_table(statement: str) -> bool:
    s = statement.lower()
    return s.lstrip().startswith("select") and any(f"from {t}" in s or f"join {t}" in s for t in BIG_TABLES)


# ---- the run ------------------------------------------------------------------------------------

def measure(label: str, url: str | None, n: int, repeat: int) -> dict:
    from tests.console_helpers import logged_in, make_app

    t = Target(label, url)
    app = None
    try:
        now = clock.utcnow()
        started = time.perf_counter()
        counts = fill(t, n, now)
        fill_s = time.perf_counter() - started
        print(f"{label}: filled in {fill_s:.1f} s: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()),
              flush=True)
        if t.runtime.engine.dialect.name != "sqlite":
            # InnoDB recalculates statistics in the background after a load; do it now so plans are stable.
            # (SQLite: nothing runs ANALYZE in production, so neither does the benchmark.)
            with t.runtime.engine.begin() as c:
                c.exec_driver_sql("ANALYZE TABLE " + ", ".join(BIG_TABLES))
        app = make_app({**t.env, "CRONBOX_HANDLERS": ""})
        operator = logged_in(app)
        capture = Capture(app.extensions["cronbox"].runtime.engine)
        results = {}
        for page_label, path, empty_text in pages(t, n):
            def get():
                response = operator.get(path)
                assert response.status_code == 200, (path, response.status_code, response.get_data(as_text=True)[:300])
                return response

            body = get().get_data(as_text=True)  # warm-up (templates, connection pool)
            assert empty_text is None or empty_text not in body, (path, empty_text)
            times = []
            for _ in range(repeat):
                begun = time.perf_counter()
                get()
                times.append((time.perf_counter() - begun) * 1000)
            times.sort()
            capture.statements, capture.on = [], True
            get()
            capture.on = False
            statements = [s for s in capture.statements if on_big_table(s[0])]
            plans = [(*explain(t, stmt, params), stmt, params) for stmt, params, _ in statements]
            plans = [(ms, stmt, params, plan) for ms, plan, stmt, params in plans]
            r = {"path": path, "median": statistics.median(times),
                 "p95": times[max(0, round(0.95 * len(times)) - 1)], "plans": plans}
            results[page_label] = r
            print(f"{label} {page_label}: median {r['median']:.1f} ms, p95 {r['p95']:.1f} ms "
                  f"({len(capture.statements)} statements)", flush=True)
        return {"counts": counts, "fill_s": fill_s, "pages": results}
    finally:
        if app is not None:
            app.extensions["cronbox"].runtime.dispose()
        t.close()


def print_plans(label: str, result: dict) -> None:
    """Every big-table SELECT of every page with its time and plan; the statement in full for slow pages."""
    print(f"\n### {label}: statements on the big tables, one GET each\n")
    for page_label, r in result["pages"].items():
        slow = r["median"] > SLOW_MS
        print(f"{page_label}  [{r['path']}]  median {r['median']:.1f} ms{'  <-- SLOW' if slow else ''}")
        for ms, stmt, params, plan in sorted(r["plans"], key=lambda p: -p[0]):
            print(f"    {ms:7.1f} ms  {' '.join(stmt.split())[:150]}")
            for row in plan:
                print(f"               {plan_line(row)}")
            if slow and ms > SLOW_MS / 2:
                print("      statement:", " ".join(stmt.split()))
                print("      parameters:", params)


def list_query(page_label: str, r: dict):
    """The page's own list query (ORDER BY ... LIMIT, no subquery) on its main table, with its plan row."""
    table = ("cronbox_grants" if "grants" in page_label else "cronbox_file_audit" if page_label.startswith("files")
             else "cronbox_jobs" if page_label.startswith("queues") else "cronbox_deliveries")
    for ms, stmt, _, plan in r["plans"]:
        low = " ".join(stmt.split()).lower()
        if ("order by" in low and "limit" in low and low.count("select") == 1 and "group by" not in low
                and low.split(" from ", 1)[1].split()[0].strip('`"') == table):
            return ms, table, next((p for p in plan if p.get("table") == table), plan[0] if plan else {})
    return None


def index_note(result: dict) -> str:
    """Per filtered or deep list page: the index MariaDB reads for its list query, and how many rows."""
    parts = []
    for page_label, r in result["pages"].items():
        if page_label in ("once", "activity", "files") or page_label.startswith("overview"):
            continue
        found = list_query(page_label, r)
        if not found or "key" not in found[2]:
            continue
        ms, table, row = found
        read = f", {float(row['r_rows']):,.0f} rows read" if row.get("r_rows") is not None else ""
        sort = ", filesort" if "filesort" in (row.get("Extra") or "") else ""
        parts.append(f"{page_label}: `{row['key']}` ({row['type']}{read}{sort}, {ms:.1f} ms)")
    return "; ".join(parts)


def slow_note(results: dict) -> str:
    """Per page over SLOW_MS median: its costliest statements, per backend."""
    lines = []
    for label, result in results.items():
        for page_label, r in result["pages"].items():
            if r["median"] <= SLOW_MS:
                continue
            top = sorted(r["plans"], key=lambda p: -p[0])[:3]
            costs = ", ".join(f"{shape(stmt)} {ms:.0f} ms" for ms, stmt, _, _ in top if ms >= 5)
            lines.append(f"- {label}, {page_label}: {r['median']:.0f} ms; costliest statements: {costs}")
    return "\n".join(lines)


def code_version() -> str:
    """The commit measured, marked when files it tracks have uncommitted changes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*argv):
        return subprocess.run(["git", *argv], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/benchmarks.md")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit or "unknown") + (" with uncommitted changes" if dirty else "")


CAUSES = """
Where that time goes now: counting what piles up. The health check counts every dead delivery and every
failed job (50,000 each here) from the (status, consumer, next_attempt_at) and (queue, status, ...) indexes
without touching the tables, and the chart reads a day of heartbeat rows (1,440). Blocked keys are read from the
waiting side, counts from covering indexes, keyset pages carry `a <= x` in their cursor (an index range on
both backends), and MariaDB is given the (status, time, id) index, whose capped estimate would otherwise
prefer a lookup on the status alone.
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql", default=os.environ.get("TEST_MYSQL_URL", "mysql+pymysql://root:@127.0.0.1/test"))
    parser.add_argument("--no-mysql", action="store_true", help="SQLite only")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    # `app` builds a module-level application from the environment on import: keep it out of the repository.
    scratch = tempfile.mkdtemp(prefix="cronbox-bench-app-")
    os.environ.setdefault("CRONBOX_INSTANCE", os.path.join(scratch, "instance"))
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{scratch}/instance/cronbox.db")
    targets = [("SQLite", None)] + ([] if args.no_mysql else [("MariaDB", args.mysql)])
    results = {label: measure(label, url, args.rows, args.repeat) for label, url in targets}
    for label, result in results.items():
        print_plans(label, result)

    labels = list(results)
    first = results[labels[0]]["pages"]
    table = ("| page | " + " | ".join(f"{label} median | {label} p95" for label in labels) + " |\n|---|"
             + "---:|---:|" * len(labels) + "\n")
    for page_label, r in first.items():
        cells = " | ".join("{median:.1f} | {p95:.1f}".format(**results[label]["pages"][page_label]) for label in labels)
        table += f"| {page_label} (`{r['path'].split('?')[0]}`) | {cells} |\n"
    print("\n" + table)
    counts = results[labels[0]]["counts"]
    notes = (f"\nMilliseconds per GET (median and p95 of {args.repeat}, after one warm-up), through Flask's test "
             f"client in-process: no HTTP server or network, but the whole request (session check, queries, "
             f"template). {args.rows:,} rows in each of the audit, grants, jobs (half failed, 3 queues), events, "
             f"deliveries (~half dead), heartbeats (per-minute ticks), one-off runs and operator actions tables, "
             f"{counts['cronbox_files']:,} files; {SUBJECTS:,} subjects. Fresh databases on the development machine; "
             f"MariaDB tables ANALYZEd after the load, SQLite left without statistics as in production. "
             f"Code at {code_version()}.\n")
    if "MariaDB" in results:
        notes += (f"\nList queries on MariaDB (ANALYZE: index, rows actually read, statement time): "
                  f"{index_note(results['MariaDB'])}.\n")
    slow = slow_note(results)
    notes += (f"\nPages over {SLOW_MS:.0f} ms median, with the statements that cost most (each timed alone, rows "
              f"fetched):\n\n{slow}\n" if slow else f"\nNo page over {SLOW_MS:.0f} ms median.\n")
    if "deliveries GROUP BY consumer" in slow:
        notes += CAUSES
    command = "python -m bench.bench_console" + ("" if args.no_mysql else f" --mysql {args.mysql}") + \
              (f" --rows {args.rows}" if args.rows != 100_000 else "") + \
              (f" --repeat {args.repeat}" if args.repeat != 20 else "")
    write_section("console", "Operator console pages", command, table + notes)


if __name__ == "__main__":
    main()
