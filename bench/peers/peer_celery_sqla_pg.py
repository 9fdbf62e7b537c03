"""Celery on kombu's SQLAlchemy transport with its broker on PostgreSQL (SQLAlchemy's psycopg 3 dialect,
database `celery_peerbench`): peer_celery_sqla.py's app, worker and flags, only the broker URL differs; the job
body still bumps MariaDB. reset() makes the database if missing (kombu makes its tables on first connect). The
workers run `celery -A peer_celery_sqla`, which reads CELERY_PEER_BROKER from the environment they inherit."""
import os

import common

DATABASE = 'celery_peerbench'
os.environ['CELERY_PEER_BROKER'] = 'sqla+postgresql+psycopg://postgres@127.0.0.1:5432/' + DATABASE

import peer_celery_sqla  # noqa: E402
from peer_celery_sqla import BURST, enqueue_one, leftovers, pending, worker_argv  # noqa: E402,F401


def reset():
    common.create_pg_database(DATABASE)
    peer_celery_sqla.reset()
