"""cronbox is a guest in its host's process: loading and using it changes nothing of the host's
database driver (PyMySQL, psycopg2, psycopg), SQLAlchemy or imports.

A real process acts as a host app set up the README's way (Flask + Flask-SQLAlchemy, `Cronbox(app)`,
a request that calls cronbox.record() and a job's dispatch() in its transaction, then cronbox's own
/health, which makes cronbox's engine). It takes a view of what a host sees before cronbox is
imported and again at the end:

- sys.modules under the drivers, sqlalchemy, cryptography, amqp, nacl: cronbox may add modules (its
  declared dependencies), never remove or replace one, nor put a None entry;
- every public attribute of the drivers' public modules and of the SQLAlchemy dialect classes the
  host uses: the same objects (no function replaced, none added to a class);
- the host engine's dialect instance: no method set on it (`do_savepoint` ...);
- the host connection's PyMySQL conversions: PyMySQL's own.

The same host runs once without cronbox, and at the end it imports its server's driver itself (as a
host that also talks to that server does): what it gets must be what it gets without cronbox, also
when cronbox was the first to load it (a SQLite host app whose cronbox database is MariaDB or
PostgreSQL, CRONBOX_DATABASE_URL). On PostgreSQL the host app uses psycopg2, as many Flask apps do,
and cronbox its own psycopg 3 engine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import APP_ROOT, child_env

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

HOST = r'''
import json, os, sys, types

DRIVERS = ("pymysql", "psycopg2", "psycopg", "psycopg_binary")
WATCHED = DRIVERS + ("sqlalchemy", "cryptography", "amqp", "nacl")
WITH_CRONBOX = os.environ["HOST_WITH_CRONBOX"] == "1"
HOST_URL, CRONBOX_URL = os.environ["HOST_URL"], os.environ["HOST_CRONBOX_URL"]


def watched_modules():
    return {name: module for name, module in list(sys.modules.items()) if name.split(".")[0] in WATCHED}


def public_modules():
    return {name: module for name, module in watched_modules().items()
            if module is not None and name.split(".")[0] in DRIVERS
            and not any(part.startswith("_") for part in name.split("."))}


def public_attributes(module):
    return {name: value for name, value in vars(module).items() if not name.startswith("_")}


def dialect_classes(engine):
    return [cls for cls in type(engine.dialect).__mro__ if cls.__module__.startswith("sqlalchemy.")]


def named(value):
    """What a value is, comparable across processes: a function by where it was defined."""
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, (classmethod, staticmethod)):
        return "method " + named(value.__func__)
    if isinstance(value, types.ModuleType):
        return "module " + value.__name__
    if isinstance(value, (int, str, bytes, float, bool, type(None))):
        return repr(value)
    return type(value).__qualname__


def view(engine):
    """What the host sees, by name: comparable with the run without cronbox."""
    with engine.connect() as connection:
        dbapi = connection.connection.dbapi_connection
        decoders = getattr(dbapi, "decoders", None)
    return {
        "modules": sorted(name for name, module in watched_modules().items() if module is not None),
        "none_entries": sorted(name for name, module in sys.modules.items() if module is None),
        "drivers": {name: {attr: named(value) for attr, value in public_attributes(module).items()}
                    for name, module in public_modules().items()},
        "dialect_classes": {f"{cls.__module__}.{cls.__qualname__}": sorted(
            f"{attr}={named(value)}" for attr, value in vars(cls).items()
            if callable(value) or isinstance(value, (classmethod, staticmethod, property)))
            for cls in dialect_classes(engine)},
        "dialect_instance": sorted(name for name, value in vars(engine.dialect).items() if callable(value)),
        "decoders": None if decoders is None else sorted(f"{key}={named(value)}" for key, value in decoders.items()),
    }


def identities(engine):
    """The same, by identity: for the comparison inside this process."""
    return {
        "modules": dict(watched_modules()),
        "drivers": {name: public_attributes(module) for name, module in public_modules().items()},
        "dialect_classes": {cls: dict(vars(cls)) for cls in dialect_classes(engine)},
        "dialect_instance": {name: value for name, value in vars(engine.dialect).items() if callable(value)},
    }


def changed(before, after):
    """What cronbox changed of what existed before it loaded."""
    found = []
    for name, module in before["modules"].items():
        if sys.modules.get(name, "missing") is not module:
            found.append(f"sys.modules[{name!r}] removed or replaced")
    found += [f"sys.modules[{name!r}] is None" for name, module in sys.modules.items() if module is None]
    for name, attributes in before["drivers"].items():
        module = sys.modules.get(name)
        for attr, value in attributes.items():
            if getattr(module, attr, "missing") is not value:
                found.append(f"{name}.{attr} replaced")
        found += [f"{name}.{attr} added" for attr in public_attributes(module) if attr not in attributes]
    for cls, attributes in before["dialect_classes"].items():
        now = vars(cls)
        found += [f"{cls.__qualname__}.{attr} replaced" for attr, value in attributes.items() if now.get(attr, "missing") is not value]
        found += [f"{cls.__qualname__}.{attr} added" for attr in now if attr not in attributes]
    now = {name: value for name, value in vars(engine.dialect).items() if callable(value)}
    if now.keys() != before["dialect_instance"].keys():
        found.append(f"the host engine's dialect got methods: {sorted(now.keys() - before['dialect_instance'].keys())}")
    return found


# --- the host app, the README's way ------------------------------------------------------------
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import text

db = SQLAlchemy()
app = Flask("host", instance_path=os.environ["HOST_INSTANCE"])
app.config.update(SQLALCHEMY_DATABASE_URI=HOST_URL, CRONBOX_DATABASE_URL=CRONBOX_URL, CRONBOX_HANDLERS="")
db.init_app(app)
with app.app_context():
    engine = db.engine
    with engine.connect() as connection:  # the host's pool and dialect as they are when it runs
        connection.execute(text("SELECT 1"))
before = identities(engine)

result = {}
if WITH_CRONBOX:
    import cronbox
    from cronbox import Cronbox
    from cronbox.outbox.queue.jobs import job

    @job("default", name="host.note")
    def note(payload, ctx):
        pass

    Cronbox(app)

    @app.post("/pay")
    def pay():
        event = cronbox.record(db.session, "host.paid", {"n": 1})
        job_id = note.dispatch(db.session, {"n": 1})
        db.session.commit()
        return {"event": event.id, "job": job_id}

    client = app.test_client()
    paid = client.post("/pay")
    health = client.get("/health")  # cronbox's own engine, made in this process
    result["request"] = [paid.status_code, paid.get_json(), health.status_code]
    with app.app_context():
        with db.engine.connect() as connection:
            result["rows"] = [connection.execute(text("SELECT COUNT(*) FROM cronbox_events")).scalar(),
                              connection.execute(text("SELECT COUNT(*) FROM cronbox_jobs")).scalar()]

result["changed"] = changed(before, identities(engine))
import importlib  # the host's own use of its server's driver, after cronbox (a report engine, a script)
importlib.import_module(os.environ["HOST_DRIVER"])
result["view"] = view(engine)
print(json.dumps(result))
'''


# The cronbox tree the host runs (another checkout's, to see this test fail on an older cronbox).
TREE = os.environ.get("CRONBOX_GUEST_TREE", str(APP_ROOT))


def run_host(env, tmp_path, host_url: str, cronbox_url: str, *, with_cronbox: bool, pythonpath: str = TREE) -> dict:
    home = tmp_path / ("with" if with_cronbox else "without")
    home.mkdir(exist_ok=True)
    # The host's own driver on its server: psycopg2 where the host itself runs on PostgreSQL, else the
    # driver cronbox loaded first (psycopg 3, PyMySQL), which the host then imports for itself.
    driver = "psycopg2" if "psycopg2" in host_url else "psycopg" if "postgresql" in cronbox_url else "pymysql"
    extra = {"HOST_WITH_CRONBOX": "1" if with_cronbox else "0", "HOST_URL": host_url, "HOST_CRONBOX_URL": cronbox_url,
             "HOST_DRIVER": driver,
             "HOST_INSTANCE": str(home / "instance"), "PYTHONPATH": pythonpath}
    proc = subprocess.run([sys.executable, "-c", HOST], env=child_env(env, **extra), cwd=str(home),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def migrate(env, url: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "cronbox", "migrate"], env=child_env({**env, "DATABASE_URL": url}),
                          cwd=str(APP_ROOT), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("host_database", ["same", "sqlite"])
def test_cronbox_in_a_host_process_changes_none_of_its_drivers_dialects_or_imports(env, database, tmp_path, host_database):
    """host_database "same": the README's setup, the host's database is cronbox's. "sqlite": the host's
    own database is a SQLite file and cronbox's is the test's (CRONBOX_DATABASE_URL), so on MariaDB
    cronbox's engine is the first to load PyMySQL in the process."""
    if host_database == "sqlite" and not database.is_server:
        pytest.skip("the same as 'same' on SQLite")
    cronbox_url = database.url
    host_url = f"sqlite:///{tmp_path / 'host.db'}"
    if host_database == "same":  # on PostgreSQL through psycopg2, the host's own driver
        host_url = cronbox_url.replace("postgresql+psycopg:", "postgresql+psycopg2:")
    migrate(env, cronbox_url)
    if host_database != "same":
        migrate(env, host_url)  # record() and dispatch() write in the host's transaction, on its database
    without = run_host(env, tmp_path, host_url, cronbox_url, with_cronbox=False)
    hosted = run_host(env, tmp_path, host_url, cronbox_url, with_cronbox=True)

    status, ids, health = hosted["request"]
    assert status == 200 and isinstance(ids["event"], int) and isinstance(ids["job"], int)
    assert health in (200, 503)  # it answered, on cronbox's own engine
    assert hosted["rows"] == [1, 1]
    assert hosted["changed"] == []
    seen, alone = hosted["view"], without["view"]
    assert set(alone["modules"]) - set(seen["modules"]) == set()  # cronbox may add modules, never hold one back
    assert seen["none_entries"] == alone["none_entries"] == []
    assert {name: seen["drivers"][name] for name in alone["drivers"]} == alone["drivers"]
    assert seen["dialect_classes"] == alone["dialect_classes"]
    assert seen["dialect_instance"] == alone["dialect_instance"]
    assert seen["decoders"] == alone["decoders"]
