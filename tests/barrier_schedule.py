"""Run one slot of tests.race at a barrier: `python -m tests.barrier_schedule READY_DIR GO_FILE SLOT_ISO`."""
import os
import sys
import time
from datetime import datetime
from pathlib import Path

from cronbox.cron.scheduling.schedule import run_task
from cronbox.outbox.engine.runtime import open_runtime
import tests.handlers.tasks  # noqa: F401

ready_dir, go_file, slot = Path(sys.argv[1]), Path(sys.argv[2]), datetime.fromisoformat(sys.argv[3])
runtime = open_runtime()
runtime.engine.connect().close()  # connect before the barrier
(ready_dir / str(os.getpid())).write_text("ready")
while not go_file.exists():
    time.sleep(0.001)
print(run_task(runtime, runtime.registry.tasks.get("tests.race"), slot))
