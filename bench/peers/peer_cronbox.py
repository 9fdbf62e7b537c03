"""cronbox's job queue in the peer harness: MariaDB store, `queue work --stop-when-empty` workers.

The queue lives in its own database (`cronbox_peerbench`, created and migrated
by reset()); the job body is the harness's counter bump in `test`, like every peer.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
APP_ROOT = os.path.dirname(os.path.dirname(HERE))
if APP_ROOT not in sys.path:
    sys.path.insert(0, APP_ROOT)

STORE = os.environ.get("CRONBOX_PEER_STORE", "mysql")
if STORE == "sqlite":
    os.environ.setdefault("DATABASE_URL", "sqlite:////tmp/cronbox-peerbench/cronbox.db")
else:
    os.environ.setdefault("DATABASE_URL", "mysql+pymysql://root:@127.0.0.1/cronbox_peerbench")
os.environ.setdefault("CRONBOX_INSTANCE", "/tmp/cronbox-peerbench")
os.environ["CRONBOX_HANDLERS"] = "peer_cronbox"

import pymysql  # noqa: E402
from sqlalchemy import func, select, text  # noqa: E402

import common  # noqa: E402
import outbox  # noqa: E402
from outbox.core.migrate import upgrade  # noqa: E402
from outbox.core.settings import load_settings  # noqa: E402
from outbox.engine.runtime import Runtime  # noqa: E402
from outbox.queue.models import Job  # noqa: E402


@outbox.job("bench", name="bench.bump", tries=3, timeout=30)
def bump(payload, ctx):
    common.bump()


_runtime = None


def runtime():
    global _runtime
    if _runtime is None:
        if STORE != "sqlite":
            name = os.environ["DATABASE_URL"].rsplit("/", 1)[1]  # cronbox_peerbench unless told otherwise
            with pymysql.connect(host="127.0.0.1", user="root", password="", ssl_disabled=True) as conn:
                conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}`")
        settings = load_settings()
        _runtime = Runtime(settings, role="web")
        upgrade(settings, _runtime.engine)
    return _runtime


def reset():
    with runtime().engine.begin() as conn:
        conn.execute(text("DELETE FROM cronbox_jobs"))


def enqueue_one():
    with runtime().sessions.begin() as session:
        bump.dispatch(session, None)


def pending():
    with runtime().sessions() as session:
        return session.scalar(select(func.count()).select_from(Job).where(Job.available_at.is_not(None)))


def worker_argv(i):
    return [sys.executable, os.path.join(HERE, "cronbox_worker.py"), "queue", "work", "--queue", "bench",
            "--stop-when-empty"]


BURST = True
