"""A host Flask app's own code in cron processes: tests/hostapp's clinic (Flask 3 + Flask-SQLAlchemy,
a factory, Model.query / db.session / current_app in its consumer and task, a top-level `web` module
of its own), run as cron runs it.

Each test copies the clinic to `$HOME/apps/clinic` (its .env and instance/ stay in the test's folder)
and runs real processes: the host's own route records an event with `cronbox.record(db.session, ...)`
in its transaction, then `python -m cronbox tick` (from $HOME, CRONBOX_APP=clinic:create_app),
`artisan_via_cron.sh tick` under `env -i` (everything from .env), or `flask --app clinic cron tick`
delivers it. The test reads the database through its own NullPool engine, so it holds no connection
to the test's database while it counts the cron process's connections on a server (MariaDB, PostgreSQL: the host app on psycopg2, cronbox on psycopg 3).
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests import helpers
from tests.conftest import APP_ROOT, child_env

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")
HOSTAPP = APP_ROOT / "tests" / "hostapp"
CRONBOX_PACKAGES = ("cronbox",)  # what a pip install would put on the path 
BARE_PATH = "/usr/bin:/bin"
SPEC = "clinic:create_app"
RECEIPT_ERROR = "RuntimeError: receipt for appointment {} failed on purpose"


@dataclass
class Host:
    home: Path
    root: Path
    url: str
    database_name: str | None  # a server's: the test's database, for its connection count
    env: dict[str, str] = field(default_factory=dict)  # the host's own configuration (CLINIC_*)

    @property
    def is_mysql(self) -> bool:
        return self.url.startswith("mysql")

    @property
    def is_server(self) -> bool:
        return self.database_name is not None

    # --- processes ------------------------------------------------------------------------------

    def cron_env(self, **extra: str) -> dict[str, str]:
        return child_env({**self.env, "CRONBOX_APP": SPEC, "CRONBOX_APP_ROOT": str(self.root), **extra})

    def start_cron(self, *args: str, **extra: str) -> subprocess.Popen:
        """`python -m cronbox ARGS` from $HOME (cron's working directory), the app named by CRONBOX_APP."""
        return subprocess.Popen([sys.executable, "-m", "cronbox", *args], env=self.cron_env(**extra), cwd=str(self.home),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def cron(self, *args: str, **extra: str) -> subprocess.CompletedProcess:
        return finish(self.start_cron(*args, **extra))

    def start_artisan(self, *args: str, **extra: str) -> subprocess.Popen:
        """What cron does with `* * * * * <root>/artisan_via_cron.sh ARGS`: `env -i`, /bin/sh -c, in $HOME."""
        line = " ".join(shlex.quote(a) for a in [str(self.root / "artisan_via_cron.sh"), *args])
        bare = ["/usr/bin/env", "-i", f"PATH={BARE_PATH}", f"HOME={self.home}", *(f"{k}={v}" for k, v in extra.items())]
        return subprocess.Popen([*bare, "/bin/sh", "-c", line], cwd=str(self.home), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def flask(self, *args: str, **extra: str) -> subprocess.CompletedProcess:
        """`flask --app clinic ARGS` from the app root, as a developer types it (no CRONBOX_APP)."""
        return subprocess.run([sys.executable, "-m", "flask", "--app", "clinic", *args],
                              env=child_env({**self.env, **extra}), cwd=str(self.root), capture_output=True,
                              text=True, timeout=120)

    def python(self, code: str, **extra: str) -> subprocess.CompletedProcess:
        """Host code (a web process, a shell) run from the app root."""
        proc = subprocess.run([sys.executable, "-c", code], env=child_env({**self.env, **extra}), cwd=str(self.root),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def pay(self, patient: str) -> int:
        """Book and pay an appointment through the host's own routes (the event is recorded in the
        route's db.session transaction); returns its id."""
        proc = self.python(
            "from clinic import create_app\n"
            "client = create_app().test_client()\n"
            f"booked = client.post('/appointments', data={{'patient': {patient!r}}})\n"
            "assert booked.status_code == 201, booked.data\n"
            "paid = client.post(f\"/appointments/{booked.json['id']}/pay\")\n"
            "assert paid.status_code == 200, paid.data\n"
            "print(booked.json['id'])\n")
        return int(proc.stdout.split()[-1])

    # --- the database, read by the test ---------------------------------------------------------

    def rows(self, sql: str, **params) -> list[tuple]:
        """The rows of plain SQL, as the host would send it. cronbox's identity columns are VARBINARY
        on MySQL (outbox.core.models.ExactString): read raw, they are bytes, decoded here."""
        engine = create_engine(self.url, poolclass=NullPool,
                               connect_args={"ssl_disabled": True} if self.is_mysql else {})
        try:
            with engine.begin() as connection:
                result = connection.execute(text(sql), params)
                return ([tuple(v.decode() if isinstance(v, bytes) else v for v in row) for row in result]
                        if result.returns_rows else [])
        finally:
            engine.dispose()

    def notes(self, appointment_id: int) -> list[tuple]:
        return self.rows("SELECT source, text FROM clinic_notes WHERE appointment_id = :a ORDER BY source",
                         a=appointment_id)

    def delivery(self, appointment_id: int) -> tuple:
        [row] = self.rows(
            "SELECT d.consumer, d.status, d.attempts, d.last_error, d.next_attempt_at FROM cronbox_deliveries d "
            "JOIN cronbox_events e ON e.id = d.event_id WHERE e.key = :k", k=f"appointment:{appointment_id}")
        return row

    def status(self, appointment_id: int) -> str:
        [(status,)] = self.rows("SELECT status FROM clinic_appointments WHERE id = :a", a=appointment_id)
        return status


def finish(proc: subprocess.Popen, timeout: float = 120) -> subprocess.CompletedProcess:
    with helpers.reaped(proc):
        out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def delivered(proc: subprocess.CompletedProcess, count: int) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"tick: delivered {count},"), proc.stdout + proc.stderr


def paid_notes(appointment_id: int) -> list[tuple]:
    """What the consumer writes for one appointment: a note through db.session (with current_app's
    name), one through ctx.session, both through the host's own `web` module."""
    return [("ctx.session", f"clinic-web: appointment {appointment_id} paid (ctx)"),
            ("db.session", f"clinic-web: appointment {appointment_id} paid (clinic)")]


@pytest.fixture
def host(database, tmp_path, request) -> Host:
    home = tmp_path / "home"
    root = home / "apps" / "clinic"
    shutil.copytree(HOSTAPP, root, ignore=shutil.ignore_patterns("__pycache__"))
    url = f"sqlite:///{tmp_path / 'clinic.db'}"
    if database.is_server:  # on PostgreSQL the host's Flask-SQLAlchemy uses psycopg2, as many do; cronbox psycopg 3
        url = database.url.replace("postgresql+psycopg:", "postgresql+psycopg2:")
    host = Host(home=home, root=root, url=url, database_name=database.name,
                env={"CLINIC_SQLALCHEMY_DATABASE_URI": url, "CLINIC_CRONBOX_HANDLERS": "clinic.handlers",
                     "CRONBOX_CLAIM_MODE": database.claim_mode})
    migrated = host.cron("migrate")
    assert migrated.returncode == 0 and "migrate: empty ->" in migrated.stdout, migrated.stdout + migrated.stderr
    return host


class ConnectionWatch:
    """Counts, every few milliseconds, the connections the server has open on the test's database
    (MariaDB's information_schema.PROCESSLIST, PostgreSQL's pg_stat_activity), from a connection of
    its own to another database."""

    COUNT = {"mysql": "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = :db",
             "postgresql": "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = :db AND backend_type = 'client backend'"}

    def __init__(self, request, name: str, is_mysql: bool = True):
        self.admin = request.getfixturevalue("mysql_admin" if is_mysql else "postgres_admin")
        self.count = self.COUNT["mysql" if is_mysql else "postgresql"]
        self.name = name
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with self.admin.connect() as connection:  # on TEST_MYSQL_URL's database, so not counted
            while not self._stop.is_set():
                self.samples.append(connection.execute(text(self.count), {"db": self.name}).scalar_one())
                time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> str:
    """The file's text once the consumer has written it: not just created (write_text makes it empty
    first), which a fixed pause after it appears cannot tell on a loaded machine."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        if proc.poll() is not None:
            raise AssertionError(f"the tick ended before the consumer ran: {finish(proc)}")
        assert time.monotonic() < deadline, f"no {path.name} after {timeout}s"
        time.sleep(0.01)
    return path.read_text()


def run_scenario(host: Host, start_tick, request, tmp_path, done=finish) -> None:
    """The acceptance: one delivery applied exactly once; a failing attempt leaves nothing and is
    rescheduled with its error; its retry applies once; on a server at most 2 connections throughout."""
    first = host.pay("Ann")
    assert host.notes(first) == [] and host.rows(  # committed with the payment, not yet fanned out
        "SELECT e.type, e.fanned_out_at FROM cronbox_events e WHERE e.key = :k",
        k=f"appointment:{first}") == [("appointment.paid", None)]

    inside, release = tmp_path / "inside", tmp_path / "release"
    with ConnectionWatch(request, host.database_name, host.is_mysql) if host.is_server else nullcontext() as watch:
        proc = start_tick(CLINIC_INSIDE_FILE=str(inside), CLINIC_RELEASE_FILE=str(release))
        seen_by_consumer = wait_for(inside, proc)
        if watch:  # a few samples while the consumer holds its transaction open (however slow they come)
            taken = len(watch.samples)
            helpers.wait_for(lambda: len(watch.samples) >= taken + 5, "samples while the consumer holds its transaction")
        release.write_text("go")
        result = done(proc)
    delivered(result, 1)
    if watch:
        assert watch.samples and max(watch.samples) <= 2, Counter(watch.samples)  # connections: how often seen
        assert 1 <= int(seen_by_consumer) <= 2
    assert host.notes(first) == paid_notes(first)
    assert host.status(first) == "paid"  # Model.query's object, changed and committed with the ack
    assert host.delivery(first)[:3] == ("clinic.receipt", "done", 1)

    second = host.pay("Bob")
    failed = done(start_tick(CLINIC_FAIL="1"))
    assert failed.returncode == 0 and failed.stdout.startswith("tick: delivered 0, retried 1,"), failed
    assert host.notes(second) == [] and host.status(second) == "booked"  # both sessions rolled back
    consumer, status, attempts, error, next_attempt = host.delivery(second)
    assert (consumer, status, attempts, error) == ("clinic.receipt", "pending", 1, RECEIPT_ERROR.format(second))
    [(later,)] = host.rows("SELECT COUNT(*) FROM cronbox_deliveries WHERE id IN (SELECT d.id FROM cronbox_deliveries d "
                           "JOIN cronbox_events e ON e.id = d.event_id WHERE e.key = :k) AND next_attempt_at > :t",
                           k=f"appointment:{second}", t=_utc_in(40))
    assert later == 1, next_attempt  # backoff=60 (±20 %): rescheduled, not retried at once

    host.rows("UPDATE cronbox_deliveries SET next_attempt_at = :t WHERE status = 'pending'", t=_utc_in(-1))
    delivered(done(start_tick()), 1)
    assert host.notes(second) == paid_notes(second) and host.status(second) == "paid"
    assert host.delivery(second)[1:3] == ("done", 2)
    delivered(done(start_tick()), 0)
    assert host.notes(first) == paid_notes(first) and host.notes(second) == paid_notes(second)  # exactly once
    [(others,)] = host.rows("SELECT COUNT(*) FROM cronbox_deliveries WHERE consumer <> 'clinic.receipt'")
    assert others == 0  # no demo (or any other) consumer fanned out the clinic's events


def _utc_in(seconds: float) -> datetime:
    """A naive UTC time, as cronbox's columns hold them."""
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).replace(tzinfo=None)


# --- 1. python -m cronbox with CRONBOX_APP ------------------------------------------------------------

def test_a_cron_tick_runs_the_hosts_consumer_in_its_app_on_one_transaction(host, request, tmp_path):
    run_scenario(host, lambda **extra: host.start_cron("tick", "--no-linger", **extra), request, tmp_path)
    assert not (host.home / "instance").exists()  # nothing written where cron runs
    logs = host.root / "instance" / "cronbox" / "logs"  # the extension's instance: <app.instance_path>/cronbox
    assert "consumer=clinic.receipt" in "".join(p.read_text() for p in logs.glob("cronbox-*.log"))


# --- 2. artisan_via_cron.sh under env -i, everything from .env -----------------------------------

def artisan_root(host: Host) -> None:
    """The script and cronbox's packages in the app root (as a pip install would make them importable),
    the settings in .env: cron passes nothing but PATH and HOME."""
    shutil.copy2(APP_ROOT / "artisan_via_cron.sh", host.root / "artisan_via_cron.sh")
    for name in CRONBOX_PACKAGES:
        (host.root / name).symlink_to(APP_ROOT / name)
    lines = [f"CRONBOX_APP = '{SPEC}'  # the host app",
             f"CRONBOX_PYTHON={sys.executable}",
             "CRONBOX_HANDLERS=clinic.handlers",
             f"CLINIC_SQLALCHEMY_DATABASE_URI={host.url}",
             f"CRONBOX_CLAIM_MODE={host.env['CRONBOX_CLAIM_MODE']}"]
    (host.root / ".env").write_text("\n".join(lines) + "\n")
    host.env = {}  # from here on, the host's configuration is its .env only


def test_artisan_via_cron_runs_the_host_app_from_its_env_file(host, request, tmp_path):
    artisan_root(host)
    logs = host.root / "instance" / "cronbox" / "logs"  # CRONBOX_APP set, CRONBOX_INSTANCE not

    def silent(proc: subprocess.Popen) -> subprocess.CompletedProcess:
        """The script prints nothing on success (cron mails nothing): the tick's summary is in its log."""
        result = finish(proc)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), result
        log = "".join(p.read_text() for p in sorted(logs.glob("cron-*.log")))
        summary = [line for line in log.splitlines() if line.startswith("tick: ")][-1]
        return subprocess.CompletedProcess(result.args, 0, summary + "\n", "")

    run_scenario(host, lambda **extra: host.start_artisan("tick", "--no-linger", **extra), request, tmp_path,
                 done=silent)
    assert sorted({p.name.split("-")[0] for p in logs.iterdir()}) == ["cron", "cronbox"]  # one folder for both
    assert not (host.root / "instance" / "logs").exists() and not (host.home / "instance").exists()
    log = "".join(p.read_text() for p in logs.glob("cron-*.log"))
    assert f"start: tick --no-linger (python: {sys.executable})" in log


# --- 3. flask --app clinic cron ... ----------------------------------------------------------------

@pytest.mark.backends("sqlite")  # which command group runs: the database changes nothing
def test_flask_cli_runs_cronbox_from_the_hosts_cron_group(host):
    """`flask --app clinic cron tick`: the extension's `cron` group on app.cli, in the app Flask built;
    a one-off run the tick takes from a request file runs on that same group (not on Flask's root)."""
    first = host.pay("Ann")
    inbox = host.root / "instance" / "cronbox" / "run-once"
    inbox.mkdir(parents=True)
    request_file = inbox / "summary.cmd"
    request_file.write_text("schedule run clinic.summary\n")
    old = time.time() - 60  # File Manager's files wait 10 s before they are taken
    os.utime(request_file, (old, old))
    proc = host.flask("cron", "tick", "--no-linger")
    delivered(proc, 1)
    assert "one-off runs 1" in proc.stdout, proc.stdout
    assert host.notes(first) == paid_notes(first)
    shown = host.flask("cron", "once", "show", "1")
    assert "status done, exit code 0" in shown.stdout and "schedule run clinic.summary: ok" in shown.stdout, shown
    status = host.flask("cron", "outbox", "status")
    assert status.returncode == 0 and consumers_listed(status.stdout) == ["clinic.receipt"], status


# --- 4. the demo stays out -------------------------------------------------------------------------

def consumers_listed(status_output: str) -> list[str]:
    """The consumer names of `outbox status`'s table."""
    lines = status_output.splitlines()
    assert lines[0].split()[0] == "consumer", status_output
    return [line.split()[0] for line in lines[1:] if line and not line.startswith("events not yet")]


@pytest.mark.backends("sqlite")  # which consumers the commands know: the database changes nothing
def test_the_hosts_commands_know_only_the_hosts_consumers(host):
    host.pay("Ann")
    status = host.cron("outbox", "status")
    assert status.returncode == 0 and consumers_listed(status.stdout) == ["clinic.receipt"], status
    listed = host.cron("schedule", "list")
    assert "clinic.summary" in listed.stdout and "demo" not in listed.stdout, listed
    probe = host.python(  # the whole command tree and the app, as a cron process builds them
        "import sys\n"
        "from cronbox.cron.cli import cli\n"
        "from clinic import create_app\n"
        "runtime = create_app().extensions['cronbox'].runtime\n"
        "print(sorted(runtime.consumers.names()), 'cronbox.cron.demo' in sys.modules)\n")
    assert probe.stdout.split("\n")[-2] == "['clinic.receipt'] False", probe.stdout


# --- 5. cronbox's own app.py: built once, on first use ----------------------------------------------

COUNT_BUILDS = """
import flask
from cronbox.outbox.engine import runtime as runtimes
built = {"apps": 0, "runtimes": []}
flask_init, runtime_init = flask.Flask.__init__, runtimes.Runtime.__init__
def count_app(self, *args, **kwargs):
    built["apps"] += 1
    flask_init(self, *args, **kwargs)
def count_runtime(self, *args, **kwargs):
    built["runtimes"].append(kwargs.get("role"))
    runtime_init(self, *args, **kwargs)
flask.Flask.__init__, runtimes.Runtime.__init__ = count_app, count_runtime
"""


@pytest.mark.backends("sqlite")
def test_cronbox_app_py_is_one_app_and_one_runtime_under_cronbox_app(env, runtime, tmp_path):
    code = COUNT_BUILDS + (
        "from cronbox.cron.cli import main\n"
        "code = main(['outbox', 'status'])\n"
        "import app\n"
        "print(code, built['apps'], built['runtimes'], 'application' in vars(app))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(env, CRONBOX_APP="app:create_app"),
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "0 1 ['cron'] False", proc.stdout  # `application` never built


@pytest.mark.backends("sqlite")
def test_passenger_wsgi_still_imports_application(env, runtime):
    code = COUNT_BUILDS + (
        "from passenger_wsgi import application\n"
        "import app\n"
        "assert app.application is application and isinstance(application, flask.Flask)\n"
        "from app import application as again\n"
        "answer = application.test_client().get('/health')\n"
        "print(built['apps'], again is application, answer.status_code in (200, 503), sorted(answer.json))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(env), cwd=str(APP_ROOT),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "1 True True ['status']", proc.stdout  # 503 until a tick ran


# --- 6. a bad CRONBOX_APP: one line naming it, exit 1 ----------------------------------------------

@pytest.mark.backends("sqlite")  # nothing here reaches the database
@pytest.mark.parametrize("spec, reason", [
    ("clinic_not_here:create_app", "could not import 'clinic_not_here': ModuleNotFoundError"),
    ("clinic.unimportable", "could not import 'clinic.unimportable': ModuleNotFoundError: No module named "
                            "'clinic_dependency_not_installed'"),
    ("clinic:no_such_factory", "'clinic' has no no_such_factory"),
    ("web", "'web' has no create_app / make_app / app / application"),
    ("clinic.misconfigured:raising", "raising() failed: RuntimeError: no configuration for this clinic "
                                     "(and a second line)"),
    ("clinic.misconfigured:not_an_app", "not_an_app is not a Flask app or a factory returning one"),
    ("clinic:db", "db is not a Flask app or a factory returning one"),
    ("clinic.misconfigured:without_cronbox", "the app does not set up cronbox (call Cronbox().init_app(app)"),
])
def test_a_bad_cronbox_app_is_one_line_naming_it(host, spec, reason):
    for args in (["tick", "--no-linger"], ["outbox", "status"]):
        proc = host.cron(*args, CRONBOX_APP=spec)
        assert (proc.returncode, proc.stdout) == (1, ""), proc
        assert "Traceback" not in proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.startswith(f"error: CRONBOX_APP={spec}: ") and reason in line, line


@pytest.mark.backends("sqlite")
def test_a_bad_cronbox_app_in_env_reaches_crons_mail_in_one_line(host):
    artisan_root(host)
    env_file = host.root / ".env"
    env_file.write_text(env_file.read_text().replace(SPEC, "clinic.misconfigured:raising"))
    result = finish(host.start_artisan("tick"))
    assert result.returncode == 1 and result.stdout == "", result
    [line] = result.stderr.splitlines()
    assert line.startswith("artisan_via_cron.sh: tick failed with exit 1: error: CRONBOX_APP=clinic.misconfigured:"
                           "raising: raising() failed: RuntimeError: no configuration"), line


# --- 7. handler modules come after the factory ------------------------------------------------------

def test_handlers_are_imported_after_the_factory_returns(host):
    """clinic.handlers does `from clinic import db` and refuses to be imported while create_app() runs
    (tests/hostapp/clinic/handlers.py): every cron command above imported it; here the web side, where
    it is imported on the first use of the runtime, not by init_app."""
    probe = host.python(
        "import sys\n"
        "from clinic import create_app\n"
        "app = create_app()\n"
        "before = 'clinic.handlers' in sys.modules\n"
        "runtime = app.extensions['cronbox'].runtime\n"
        "print(before, 'clinic.handlers' in sys.modules, sorted(runtime.consumers.names()))\n")
    assert probe.stdout.splitlines()[-1] == "False True ['clinic.receipt']", probe.stdout
    status = host.cron("outbox", "status")
    assert status.returncode == 0 and "clinic.receipt" in status.stdout, status


# --- 8. scheduled tasks -----------------------------------------------------------------------------

def task_notes(host: Host) -> list[tuple]:
    return host.rows("SELECT source, text FROM clinic_notes WHERE appointment_id IS NULL ORDER BY source")


def test_a_scheduled_task_runs_in_the_host_app_on_the_tasks_session(host):
    paid = host.pay("Ann")
    delivered(host.cron("tick", "--no-linger"), 1)  # its own slot of clinic.summary runs too
    assert host.notes(paid) == paid_notes(paid)
    before = task_notes(host)
    assert [source for source, _ in before] == ["task ctx.session", "task db.session"], before

    failed = host.cron("schedule", "run", "clinic.summary", CLINIC_FAIL="1")
    assert failed.returncode == 1 and "schedule run clinic.summary: error" in failed.stdout, failed
    assert task_notes(host) == before  # what it wrote through db.session and ctx.session rolled back
    listed = host.cron("schedule", "list")
    assert "RuntimeError: summary failed on purpose" in listed.stdout, listed.stdout

    ran = host.cron("schedule", "run", "clinic.summary")
    assert ran.returncode == 0 and "schedule run clinic.summary: ok" in ran.stdout, ran
    after = task_notes(host)
    assert len(after) == 4 and ("task db.session", "clinic: 1 paid") in after  # Model.query, current_app.name


# --- web ticks: the same host scope ----------------------------------------------------------------

WEB_TICK = (
    "from clinic import create_app\n"
    "answer = create_app().test_client().post('/cron/tick', headers={'Authorization': 'Bearer web-tick-token'})\n"
    "print(answer.status_code, answer.json['delivered'], answer.json['retried'])\n")


def test_a_web_tick_runs_the_hosts_consumer_in_the_same_scope(host):
    """POST /cron/tick runs handlers inside a request of the host's app: db.session there must still be
    the handler's session (not the request's, whose commit() would really commit), on cronbox's
    connection, so a failed attempt leaves nothing."""
    host.env.update(CLINIC_CRONBOX_CRON_TOKEN="web-tick-token", CLINIC_CRONBOX_WEB_TICK_INTERVAL="1")
    paid = host.pay("Ann")
    failed = host.python(WEB_TICK, CLINIC_FAIL="1")
    assert failed.stdout.splitlines()[-1] == "200 0 1", failed.stdout
    assert host.notes(paid) == [] and host.status(paid) == "booked"
    assert host.delivery(paid)[1:4] == ("pending", 1, RECEIPT_ERROR.format(paid))
    host.rows("UPDATE cronbox_deliveries SET next_attempt_at = :t WHERE status = 'pending'", t=_utc_in(-1))
    time.sleep(1.1)  # CRONBOX_WEB_TICK_INTERVAL
    ran = host.python(WEB_TICK)
    assert ran.stdout.splitlines()[-1] == "200 1 0", ran.stdout
    assert host.notes(paid) == paid_notes(paid) and host.status(paid) == "paid"


# --- the extension's settings for a host app ------------------------------------------------------

@pytest.mark.backends("sqlite")
def test_cronbox_works_in_the_hosts_database_and_instance_unless_told_otherwise(host, tmp_path):
    probe = ("from clinic import create_app\n"
             "settings = create_app().extensions['cronbox'].settings\n"
             "print(settings.database_url, settings.instance)\n")

    def seen(**extra) -> list[str]:
        return host.python(probe, **extra).stdout.splitlines()[-1].split()

    assert seen() == [host.url, str(host.root / "instance" / "cronbox")]  # db's engine, app.instance_path/cronbox
    assert seen(DATABASE_URL="sqlite:///elsewhere.db")[0] == host.url  # the host's db wins over DATABASE_URL
    own = [f"sqlite:///{tmp_path / name}.db" for name in ("dotenv", "environ", "config")]
    (host.root / ".env").write_text(f"CRONBOX_DATABASE_URL={own[0]}\n")
    assert seen()[0] == own[0]
    assert seen(CRONBOX_DATABASE_URL=own[1])[0] == own[1]  # the environment wins over .env
    assert seen(CRONBOX_DATABASE_URL=own[1], CLINIC_CRONBOX_DATABASE_URL=own[2])[0] == own[2]  # app.config first
