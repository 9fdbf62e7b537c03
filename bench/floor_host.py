"""cronbox as a user runs it, from the tree under test: a fresh database migrated by
`python -m cronbox migrate`, and `tick`, `queue work` and `amqp consume` subprocesses timed start to exit.

The parent (bench_floors) imports this module without cronbox. Run as a program, with the tree first
on sys.path, it is the host side of record/dispatch and the seeding of events and jobs, through
cronbox's public calls (`cronbox.record`, a job's `.dispatch`) in the host's own SQLAlchemy Session:

    python bench/floor_host.py record|dispatch|seed-events TYPE|seed-jobs HANDLER|seed-numbered-jobs HANDLER  URL N
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from floor_sql import psycopg_url

BENCH = Path(__file__).resolve().parent
PEERS = BENCH / "peers"
TABLES = ("cronbox_inbox", "cronbox_deliveries", "cronbox_flights", "cronbox_events", "cronbox_jobs",
          "bench_floor_rows")
# The one-row consumers' table (floor_sql.ROW_INSERT, floor_handlers.ROW_INSERT), an auto-increment key on each backend.
FLOOR_ROWS = Table("bench_floor_rows", MetaData(), Column("id", Integer, primary_key=True), Column("event_id", Integer),
                   Column("note", String(32)))


def run(argv: list[str], env: dict, *, timeout: float = 600, cwd: str | None = None) -> dict:
    """Start to exit: wall seconds, the child's CPU seconds (user + system) and its stdout."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=cwd)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {process.returncode}:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "stdout": stdout, "stderr": stderr}


class Target:
    """A fresh database (SQLite file, MariaDB schema or PostgreSQL database) migrated by the tree's own
    `python -m cronbox migrate`. `server_url`: a MariaDB or PostgreSQL server's URL (None: SQLite)."""

    def __init__(self, tree: str, server_url: str | None, extra_env: dict | None = None):
        self.folder = Path(tempfile.mkdtemp(prefix="cronbox-floor-"))
        self.admin = None
        if server_url:
            postgres = server_url.startswith("postgres")  # through psycopg 3, as cronbox's own engines
            server_url = psycopg_url(server_url) if postgres else server_url
            self.name = f"cronbox_floor_{secrets.token_hex(4)}"
            self.admin = create_engine(server_url, poolclass=NullPool, **(
                {"isolation_level": "AUTOCOMMIT"} if postgres else {"connect_args": {"ssl_disabled": True}}))
            with self.admin.connect() as c:
                c.execute(text(f"CREATE DATABASE {self.name}"))
            self.url = make_url(server_url).set(database=self.name).render_as_string(hide_password=False)
        else:
            (self.folder / "instance").mkdir()
            self.url = f"sqlite:///{self.folder / 'instance' / 'cronbox.db'}"
        self.env = {**os.environ, "DATABASE_URL": self.url, "CRONBOX_INSTANCE": str(self.folder / "instance"),
                    "CRONBOX_HANDLERS": "floor_handlers", **(extra_env or {})}
        self.use(tree)
        self.cron(["migrate"])
        self.engine = create_engine(self.url, poolclass=NullPool, connect_args={} if server_url else {"timeout": 30})
        FLOOR_ROWS.create(self.engine)
        self.tables = [t for t in TABLES if t in inspect(self.engine).get_table_names()]

    def use(self, tree: str) -> None:
        """Run cronbox from `tree` from now on (bench_floors --before: two trees on one database, whose
        migrations must be the same)."""
        self.tree = str(Path(tree).resolve())
        self.env["PYTHONPATH"] = os.pathsep.join([self.tree, str(BENCH), str(PEERS)])

    def cron(self, args: list[str], **kw) -> dict:
        """`python -m cronbox ARGS` as the README's cron line runs it, from the tree's directory: `-m` puts
        the working directory first on sys.path, ahead of PYTHONPATH, so a bench started in another
        checkout would run that checkout's cronbox instead (both trees of a --before run, until issue 41)."""
        return run([sys.executable, "-m", "cronbox", *args], self.env, cwd=self.tree, **kw)

    def host(self, args: list[str]) -> dict:
        """This module as a program (record, dispatch, seeding) in the tree."""
        result = run([sys.executable, str(BENCH / "floor_host.py"), *args[:1], self.url, *args[1:]], self.env)
        return {**result, **json.loads(result["stdout"].strip().splitlines()[-1])}

    def floor(self, module: str, args: list[str], env: dict | None = None) -> dict:
        """A floor program (floor_sql.py / floor_amqp.py): no cronbox on its path."""
        floor_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(PEERS)]), **(env or {})}
        result = run([sys.executable, str(BENCH / module), args[0], self.url, *args[1:]], floor_env)
        return {**result, **json.loads(result["stdout"].strip().splitlines()[-1])}

    def fresh(self, seed: str, what: str, n: int) -> None:
        """Empty tables, then n events of type `what` (seed-events) or jobs of `what` (seed-jobs,
        seed-numbered-jobs), untimed."""
        self.reset()
        if n:
            self.host([seed, what, str(n)])

    def count(self, table: str, where: str = "1=1") -> int:
        with self.engine.connect() as c:
            return c.execute(text(f"SELECT COUNT(*) FROM {table} WHERE {where}")).scalar_one()

    def reset(self) -> None:
        """Empty the tables. PostgreSQL: TRUNCATE, so no run scans the index entries of the last run's
        dead rows (DELETE leaves them to autovacuum, whichever run comes first in a round pays)."""
        with self.engine.begin() as c:
            if self.engine.dialect.name == "postgresql":
                c.execute(text(f"TRUNCATE {', '.join(self.tables)}"))
                return
            for table in self.tables:
                c.execute(text(f"DELETE FROM {table}"))

    def close(self) -> None:
        self.engine.dispose()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.admin is not None:
            force = " WITH (FORCE)" if self.admin.dialect.name == "postgresql" else ""
            with self.admin.connect() as c:
                c.execute(text(f"DROP DATABASE {self.name}{force}"))
            self.admin.dispose()


def _program(kind: str, url: str, rest: list[str]) -> None:
    """The host side, in the tree: the host's own engine and ORM Session, cronbox's public calls."""
    from sqlalchemy.orm import Session

    import floor_handlers
    import cronbox
    from floor_sql import cpu_seconds, engine_for

    engine = engine_for(url)
    started, cpu = time.perf_counter(), cpu_seconds()
    if kind in ("record", "dispatch"):
        for i in range(int(rest[0])):
            with Session(engine) as s, s.begin():
                if kind == "record":
                    cronbox.record(s, "fl.noop", {"i": i})
                else:
                    floor_handlers.peer_body.dispatch(s, None)
    elif kind == "seed-events":
        event_type, n = rest[0], int(rest[1])
        for start in range(0, n, 500):
            with Session(engine) as s, s.begin():
                for i in range(start, min(n, start + 500)):
                    cronbox.record(s, event_type, {"i": i})
    elif kind in ("seed-jobs", "seed-numbered-jobs"):  # numbered: payload {"i": i} (the one-row job's event_id)
        job, n = getattr(floor_handlers, rest[0]), int(rest[1])
        numbered = kind == "seed-numbered-jobs"
        for start in range(0, n, 500):
            with Session(engine) as s, s.begin():
                for i in range(start, min(n, start + 500)):
                    job.dispatch(s, {"i": i} if numbered else None)
    else:
        raise SystemExit(f"unknown kind {kind}")
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu": cpu_seconds() - cpu}))


if __name__ == "__main__":
    _program(sys.argv[1], sys.argv[2], sys.argv[3:])
