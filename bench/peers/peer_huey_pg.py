"""huey SqlHuey on PostgreSQL: peer_huey_mysql.py (the same task, worker and flags) with peewee's
PostgresqlDatabase on psycopg 3 in the database `huey_peerbench` instead of MariaDB's `test`; the job body
still bumps MariaDB. The database is made, if missing, when this module is imported (by bench.py, before
reset()), since SqlHuey creates its tables when peer_huey_mysql is imported. The workers run
`huey_consumer peer_huey_mysql.huey`, which reads HUEY_PEER_PG from the environment they inherit."""
import os

import common

DATABASE = 'huey_peerbench'
os.environ['HUEY_PEER_PG'] = 'postgresql://postgres@127.0.0.1:5432/' + DATABASE
common.create_pg_database(DATABASE)

from peer_huey_mysql import BURST, enqueue_one, pending, reset, worker_argv  # noqa: E402,F401
