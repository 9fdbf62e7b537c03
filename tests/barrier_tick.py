"""Start a tick only when the test says go: `python -m tests.barrier_tick READY_DIR GO_FILE ARGS...`.

Used to release several ticks at the same instant (a barrier, not sleeps).
"""
import os
import sys
import time
from pathlib import Path

ready_dir, go_file, args = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]

from cronbox.cron.cli import main  # noqa: E402  (import everything before the barrier)

(ready_dir / str(os.getpid())).write_text("ready")
deadline = time.monotonic() + 60
while not go_file.exists() and time.monotonic() < deadline:
    time.sleep(0.002)
sys.exit(main(args))
