"""cronbox's job queue with its embedded SQLite store (the job body still bumps MariaDB)."""
import os

os.environ["CRONBOX_PEER_STORE"] = "sqlite"
_DIR = os.environ.get("CRONBOX_PEER_DIR", "/tmp/cronbox-peerbench")  # a folder of its own per concurrent run
os.environ["DATABASE_URL"] = f"sqlite:///{_DIR}/cronbox.db"
os.environ["CRONBOX_INSTANCE"] = _DIR

from peer_cronbox import BURST, enqueue_one, pending, reset, worker_argv  # noqa: E402,F401
