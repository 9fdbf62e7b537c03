"""The command-line contract, through real processes: exit codes, one-line errors, no tracebacks."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from cronbox.outbox.core.migrate import SCHEMA_HEAD
from tests.conftest import APP_ROOT, ONE_MYSQL_MODE, child_env, run_cli

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode changes nothing these tests check


def one_line_error(proc) -> str:
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("args, code, message", [
    (["nosuch"], 2, "No such command 'nosuch'"),
    (["tick", "--bogus"], 2, "No such option '--bogus'. (see `python -m cronbox tick --help`)"),
    (["tick", "--max-time", "soon"], 2, "'soon' is not a valid float"),
    (["outbox", "retry"], 2, "give delivery ids or --all"),
    (["outbox", "retry", "7", "--all"], 2, "give delivery ids or --all"),
    (["outbox", "retry", "x"], 2, "'x' is not a valid integer range"),
    (["outbox", "skip"], 2, "give delivery ids or --all"),
    (["outbox", "prune", "--older-than", "7x"], 2, "is not a duration"),
    (["outbox", "retry", "424242"], 1, "unknown dead delivery id(s): 424242"),
    (["outbox", "skip", "5", "6"], 1, "unknown skippable delivery id(s): 5, 6"),
])
def test_user_mistakes_give_one_line_and_an_exit_code(env, runtime, args, code, message):
    proc = run_cli(env, *args)
    assert proc.returncode == code
    assert message in one_line_error(proc)


def test_help_everywhere(env):
    for args in (["--help"], ["tick", "--help"], ["outbox", "--help"], ["outbox", "prune", "--help"]):
        proc = run_cli(env, *args)
        assert proc.returncode == 0 and "Usage:" in proc.stdout


def test_bad_handler_module(env, runtime):
    proc = run_cli({**env, "CRONBOX_HANDLERS": "no.such.module"}, "tick")
    assert proc.returncode == 1
    assert "CRONBOX_HANDLERS: could not import 'no.such.module'" in one_line_error(proc)


def test_handler_module_that_raises_on_import(env, runtime, tmp_path):
    (tmp_path / "broken_handlers.py").write_text("raise RuntimeError('missing API key')\n")
    proc = run_cli({**env, "CRONBOX_HANDLERS": "broken_handlers"}, "tick", PYTHONPATH=f"{APP_ROOT}:{tmp_path}")
    assert proc.returncode == 1
    assert "RuntimeError: missing API key" in one_line_error(proc)


def test_bad_setting(env):
    proc = run_cli({**env, "CRONBOX_CLAIM_MODE": "turbo"}, "outbox", "status")
    assert proc.returncode == 1
    assert "CRONBOX_CLAIM_MODE='turbo'" in one_line_error(proc)


def test_log_lines_go_to_stderr_only_when_asked(env, runtime, settings):
    """CRONBOX_LOG_STDERR=on (a systemd unit's journal) writes each log line to stderr as well as to
    the day's file; by default (cron, which mails stderr) nothing but errors reaches stderr."""
    env = {**env, "CRONBOX_HANDLERS": "cronbox.cron.demo"}
    assert run_cli(env, "demo", "--count", "1").returncode == 0
    quiet = run_cli(env, "tick", "--no-linger")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert run_cli(env, "demo", "--count", "1").returncode == 0
    loud = run_cli(env, "tick", "--no-linger", CRONBOX_LOG_STDERR="on")
    assert loud.returncode == 0, loud.stderr
    lines = loud.stderr.splitlines()
    assert lines and all(" INFO [" in line or " WARNING [" in line for line in lines), loud.stderr
    assert any("consumer=demo.clinic_receipt" in line and "outcome=done" in line for line in lines), loud.stderr
    logged = "".join(p.read_text() for p in (settings.private_dir("logs")).glob("cronbox-*.log"))
    assert all(line.split(" ", 1)[1] in logged for line in lines if "consumer=" in line)  # the same lines, in the file too
    bad = run_cli(env, "tick", "--no-linger", CRONBOX_LOG_STDERR="yes")
    assert bad.returncode == 1 and "CRONBOX_LOG_STDERR='yes' must be on or off" in one_line_error(bad)


@pytest.mark.parametrize("url", ["mysql+pymysql://root:@127.0.0.1:1/nowhere",
                                 "sqlite:////nonexistent-dir/sub/x.db"])
def test_unreachable_database(env, tmp_path, url):
    proc = run_cli({**env, "DATABASE_URL": url, "CRONBOX_INSTANCE": str(tmp_path / "i")}, "outbox", "status")
    assert proc.returncode == 1
    assert "database unreachable" in one_line_error(proc)


def test_tick_from_any_working_directory_uses_the_app_roots_dotenv(tmp_path):
    """Cron starts us in $HOME with nothing set: .env in the app root must still be found."""
    from tests.conftest import child_env
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "from cronbox.outbox.core.settings import load_settings, CHECKOUT;"
                           "s = load_settings(); print(s.app_root == CHECKOUT, s.instance)"],
                          env={k: v for k, v in child_env({}).items() if not k.startswith("CRONBOX")},
                          cwd=str(tmp_path), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "True"


def test_status_and_dead_on_an_empty_outbox(env, runtime):
    proc = run_cli(env, "outbox", "status")
    assert proc.returncode == 0 and "events not yet fanned out: 0" in proc.stdout
    proc = run_cli(env, "outbox", "dead")
    assert proc.returncode == 0 and "no dead deliveries" in proc.stdout


def test_migrate_twice_and_the_flask_mount(env, database):
    proc = run_cli(env, "migrate")
    assert proc.returncode == 0 and f"-> {SCHEMA_HEAD}" in proc.stdout
    proc = run_cli(env, "migrate")
    assert proc.returncode == 0 and f"already at {SCHEMA_HEAD}" in proc.stdout
    import subprocess
    import sys
    from tests.conftest import child_env

    flask = subprocess.run([sys.executable, "-m", "flask", "--app", "app", "cron", "outbox", "status"],
                           env=child_env(env), cwd=str(APP_ROOT), capture_output=True, text=True)
    assert flask.returncode == 0, flask.stderr
    assert "events not yet fanned out: 0" in flask.stdout


def test_demo_then_tick_delivers(env, database):
    demo_env = {**env, "CRONBOX_HANDLERS": "cronbox.cron.demo"}
    if database.is_server:
        assert run_cli(demo_env, "migrate").returncode == 0
    proc = run_cli(demo_env, "demo", "--count", "2")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(demo_env, "tick", "--no-linger")
    assert proc.returncode == 0 and "delivered 4" in proc.stdout, proc.stdout + proc.stderr


DEMO_CONSUMERS = ("demo.clinic_receipt", "demo.notify_patient")
APP_CONSUMERS = ("import sys, app; rt = app.application.extensions['cronbox'].runtime; "
                 "print(sorted(rt.consumers.names()), 'cronbox.cron.demo' in sys.modules)")


@pytest.mark.parametrize("handlers, registered", [("", False), ("tests.handlers.effects", False),
                                                  ("cronbox.cron.demo", True)])
@pytest.mark.backends("sqlite")  # which consumers are registered: the database changes nothing
def test_demo_consumers_exist_only_where_cron_demo_is_named(env, runtime, handlers, registered):
    """The host's `outbox status` and its Flask app build the whole command tree, `demo` included:
    that must not register the demo's consumers (they would fan out and die on the missing demo tables)."""
    status = run_cli(env, "outbox", "status", CRONBOX_HANDLERS=handlers)
    assert status.returncode == 0, status.stderr
    assert all((name in status.stdout) is registered for name in DEMO_CONSUMERS), status.stdout
    flask = subprocess.run([sys.executable, "-c", APP_CONSUMERS], env=child_env(env, CRONBOX_HANDLERS=handlers),
                           cwd=str(APP_ROOT), capture_output=True, text=True)
    assert flask.returncode == 0, flask.stderr
    names, imported = flask.stdout.rsplit(" ", 1)
    assert all((name in names) is registered for name in DEMO_CONSUMERS), names
    assert imported.strip() == str(registered)


def test_no_command_prints_the_help_and_exits_2(env):
    proc = run_cli(env)
    assert proc.returncode == 2 and proc.stdout.startswith("Usage:") and "Commands:" in proc.stdout
    assert one_line_error(proc) == "error: no command given (see `python -m cronbox --help`)"


LEAN = ("amqp", "vine", "flask", "jinja2", "werkzeug", "wtforms", "flask_wtf", "itsdangerous", "cryptography", "nacl",
        "alembic", "mako")
# Each backend's driver and SQLAlchemy dialect, loaded by a process on that backend only (the models' MySQL
# column types are chosen when a MySQL engine compiles them: outbox/core/models.py).
DRIVERS = {"sqlite": ("sqlite3", "sqlalchemy.dialects.sqlite"),
           "mysql": ("pymysql", "sqlalchemy.dialects.mysql"),
           "postgresql": ("psycopg", "psycopg2", "sqlalchemy.dialects.postgresql")}
# What `queue work` never uses: the event outbox, the console's tables, retention (`queue prune` loads it).
NOT_A_WORKERS = ("cronbox.outbox.events.models", "cronbox.outbox.events.record", "cronbox.cron.operator.models",
                 "cronbox.cron.scheduling.retention")


@pytest.mark.parametrize("command", [["tick", "--no-linger"], ["queue", "work", "--stop-when-empty"]])
def test_a_plain_tick_never_loads_the_broker_client_or_flask(env, settings, command):
    """py-amqp (~70 ms to import) loads only when a tick forwards, Flask (and Jinja, Werkzeug, WTForms,
    itsdangerous) only for a host app (CRONBOX_APP), libsodium (nacl) only to seal or open a file, Alembic
    only to migrate, another backend's driver and dialect never: the standalone per-minute cron line must
    pay for none of them (a start-up and its memory are paid 1,440 times a day), even when its built-in
    tasks are due (a first tick runs them all) and a sealed-files folder exists for the hourly sweep; and
    `queue work` loads no table of the event outbox or the console. On MySQL, PyMySQL, used as it comes,
    imports `cryptography` itself (its RSA password exchange)."""
    assert run_cli(env, "migrate").returncode == 0
    settings.sealed_dir.mkdir(parents=True, exist_ok=True)
    backend = env["DATABASE_URL"].split(":")[0].split("+")[0]
    lean = tuple(m for m in LEAN if m != "cryptography" or backend != "mysql")
    lean += tuple(m for other, modules in DRIVERS.items() if other != backend for m in modules)
    lean += NOT_A_WORKERS if command[0] == "queue" else ()
    code = (f"import sys; from cronbox.cron.cli import main; code = main({command!r}); "
            f"print(code, sorted(m for m in {lean!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(env), cwd="/", capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if command[0] == "tick":
        # prune, health and the storage sweep all ran (one again if the tick crossed its next slot)
        assert int(re.search(r"tasks (\d+),", proc.stdout).group(1)) >= 3, proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout


SEALING = '''
import sys
import cronbox
from cronbox import storage
from cronbox.outbox import open_runtime

rt = open_runtime(role="cron", migrate=False)
storage.use(rt.settings, rt.sessions)  # a key vault: the standalone store's key folder
plain = cronbox.job("q", name="plain.job")(lambda payload, ctx: None)
loaded = lambda: sorted(m for m in WATCHED if m in sys.modules)
with rt.sessions.begin() as session:
    cronbox.record(session, "visit.plain", {"n": 1})
    plain.dispatch(session, {"n": 1})
    cronbox.record(session, "visit.plain", {"n": 2})
print(loaded())
with rt.sessions.begin() as session:
    job_id = cronbox.send_sms.dispatch(session, {"to": "+15550100", "text": "sealed by default"})
with rt.sessions() as session:
    from sqlalchemy import text
    sealed = session.execute(text("SELECT payload FROM cronbox_jobs WHERE id = :i"), {"i": job_id}).scalar()
print(loaded(), sealed.startswith("cbxp1:"))
'''


def test_plain_records_and_dispatches_load_no_cipher_and_the_first_sealed_one_does(env):
    """The class of the start-up test above, for a process that writes: record() and dispatch() of plain
    payloads (which ask whether CRONBOX_SEAL_PAYLOADS=all) load neither `cryptography` nor libsodium;
    the first sealed payload loads `cryptography` (its AES-GCM and HKDF) and still not libsodium."""
    assert run_cli(env, "migrate").returncode == 0
    backend = env["DATABASE_URL"].split(":")[0].split("+")[0]
    watched = ("nacl",) if backend == "mysql" else ("cryptography", "nacl")  # PyMySQL imports cryptography itself
    proc = subprocess.run([sys.executable, "-c", f"WATCHED = {watched!r}\n" + SEALING], env=child_env(env),
                          cwd="/", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, after = proc.stdout.strip().splitlines()[-2:]
    assert before == "[]", proc.stdout
    assert after == ("[]" if backend == "mysql" else "['cryptography']") + " True", proc.stdout


def test_every_command_is_on_the_root(env):
    """Commands are imported only when used (cron/cli.py's COMMANDS), and every one is still there."""
    listed = run_cli(env, "--help")
    assert all(f"  {name} " in listed.stdout for name in ("amqp", "demo", "health", "install-script", "migrate",
                                                           "once", "ops", "outbox", "queue", "schedule", "storage",
                                                           "tick")), listed.stdout



NOT_UTF8 = b"q\xff"  # a byte that is not UTF-8: Python's argv holds it as a lone surrogate
NAME_ARGS = [  # every command taking a name or id that reaches a query, a file or the sealed metadata
    ["queue", "work", "--queue", NOT_UTF8, "--stop-when-empty"], ["queue", "failed", "--queue", NOT_UTF8],
    ["queue", "retry", "--all", "--queue", NOT_UTF8], ["queue", "resume", NOT_UTF8], ["schedule", "run", NOT_UTF8],
    ["once", "add", NOT_UTF8], ["storage", "verify", NOT_UTF8], ["storage", "audit", "--file", NOT_UTF8],
    ["storage", "grant", NOT_UTF8, "--subject", "user:1"], ["storage", "revoke", NOT_UTF8], ["storage", "url", NOT_UTF8],
    ["storage", "put", "{file}", "--owner", NOT_UTF8], ["storage", "put", "{file}", "--owner", "p:1", "--name", NOT_UTF8],
    ["storage", "put", "{file}", "--owner", "p:1", "--type", NOT_UTF8],
]


@pytest.mark.backends("sqlite")  # refused before any query: the database changes nothing
def test_a_name_or_id_that_is_not_utf8_is_one_line_never_an_internal_error(env, runtime, tmp_path):
    """Before, `queue failed --queue`, `queue resume`, `storage verify` and `storage audit --file` passed
    such a name to the database driver, which failed with an encoding error: "internal error"."""
    upload = tmp_path / "scan.pdf"
    upload.write_bytes(b"%PDF")
    for args in NAME_ARGS:
        argv = [str(upload) if a == "{file}" else a for a in args]
        proc = subprocess.run([sys.executable, "-m", "cronbox", *argv], env=child_env(env), cwd="/",
                              capture_output=True, timeout=120)
        out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        shown = " ".join(a if isinstance(a, str) else repr(a) for a in args)
        assert proc.returncode in (1, 2), (shown, proc.returncode, out, err)
        assert "internal error" not in out + err and "Traceback" not in out + err, (shown, out, err)
        assert len([line for line in err.splitlines() if line.startswith("error")]) == 1, (shown, err)
