"""cronbox's job queue with a PostgreSQL store, on the server procrastinate's peer uses (the job body
still bumps MariaDB). CRONBOX_PEER_PG_URL: the database, created and migrated if missing."""
import os

os.environ["CRONBOX_PEER_STORE"] = "postgresql"
os.environ["DATABASE_URL"] = os.environ.get("CRONBOX_PEER_PG_URL",
                                            "postgresql://postgres@127.0.0.1:5432/cronbox_peerbench")

from peer_cronbox import BURST, enqueue_one, pending, reset, worker_argv  # noqa: E402,F401
