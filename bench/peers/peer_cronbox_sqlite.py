"""cronbox's job queue with its embedded SQLite store (the job body still bumps MariaDB)."""
import os

os.environ["CRONBOX_PEER_STORE"] = "sqlite"
os.environ["DATABASE_URL"] = "sqlite:////tmp/cronbox-peerbench/cronbox.db"

from peer_cronbox import BURST, enqueue_one, pending, reset, worker_argv  # noqa: E402,F401
