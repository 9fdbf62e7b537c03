"""cronbox's job queue in the peer harness: MariaDB store, `queue work --stop-when-empty` workers.

cronbox is imported from CRONBOX_TREE (default: this repository), first on sys.path, so two trees
compare in one harness (`CRONBOX_TREE=/work/wt/before bench/peers/run_peers.sh`). Only its public
surface is used: `python -m cronbox migrate` and `queue work`, and the job's `.dispatch()` in the host's own
SQLAlchemy Session. The queue lives in its own database (`cronbox_peerbench`, created and migrated by
reset()); the job body is the harness's counter bump in `test`, like every peer. CRONBOX_PEER_STORE=sqlite
or postgresql (peer_cronbox_sqlite.py, peer_cronbox_pg.py) puts the queue there instead; PostgreSQL's
`cronbox_peerbench` is on the server procrastinate's peer uses, and reset() empties it with TRUNCATE as
that peer's does.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.abspath(os.environ.get("CRONBOX_TREE") or os.path.dirname(os.path.dirname(HERE)))
if TREE not in sys.path:
    sys.path.insert(0, TREE)
os.environ["CRONBOX_TREE"] = TREE  # cronbox_worker.py starts `python -m cronbox` from the same tree

STORE = os.environ.get("CRONBOX_PEER_STORE", "mysql")
if STORE == "sqlite":
    os.environ.setdefault("DATABASE_URL", "sqlite:////tmp/cronbox-peerbench/cronbox.db")
elif STORE == "postgresql":
    os.environ.setdefault("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/cronbox_peerbench")
else:
    os.environ.setdefault("DATABASE_URL", "mysql+pymysql://root:@127.0.0.1/cronbox_peerbench")
os.environ.setdefault("CRONBOX_INSTANCE", "/tmp/cronbox-peerbench")
os.environ["CRONBOX_HANDLERS"] = "peer_cronbox"

import pymysql  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

import common  # noqa: E402
import cronbox  # noqa: E402


@cronbox.job("bench", name="bench.bump", tries=3, timeout=30)
def bump(payload, ctx):
    common.bump()


_engine = None


def engine():
    """The host's own engine on cronbox's database, migrated by the tree's `python -m cronbox migrate`."""
    global _engine
    if _engine is None:
        url = os.environ["DATABASE_URL"]
        if STORE == "sqlite":
            os.makedirs(os.environ["CRONBOX_INSTANCE"], exist_ok=True)
        elif STORE == "postgresql":
            url = make_url(url).set(drivername="postgresql+psycopg")  # the host's engine: psycopg 3, as cronbox's
            common.create_pg_database(url.database, admin=url.set(drivername="postgresql", database="postgres")
                                      .render_as_string(hide_password=False))
        else:
            name = url.rsplit("/", 1)[1]  # cronbox_peerbench unless told otherwise
            with pymysql.connect(host="127.0.0.1", user="root", password="", ssl_disabled=True) as conn:
                conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}`")
        subprocess.run([sys.executable, "-m", "cronbox", "migrate"], check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([TREE, HERE])))
        _engine = create_engine(url, connect_args={"sqlite": {"timeout": 30}, "postgresql": {}}.get(
            STORE, {"ssl_disabled": True}))
    return _engine


def reset():
    with engine().begin() as conn:
        conn.execute(text("TRUNCATE cronbox_jobs" if STORE == "postgresql" else "DELETE FROM cronbox_jobs"))


def enqueue_one():
    with Session(engine()) as session, session.begin():
        bump.dispatch(session, None)


def pending():
    with engine().connect() as conn:
        return conn.execute(text("SELECT COUNT(*) FROM cronbox_jobs WHERE available_at IS NOT NULL")).scalar_one()


def worker_argv(i):
    return [sys.executable, os.path.join(HERE, "cronbox_worker.py"), "queue", "work", "--queue", "bench",
            "--stop-when-empty"]


BURST = True
