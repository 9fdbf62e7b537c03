"""A concurrency-group job for the subprocess tests (CRONBOX_HANDLERS=tests.handlers.group_jobs).

TEST_INSIDE_FILE  group.block writes its pid there once it holds its slot, then waits (until killed)
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import outbox


@outbox.job("gq", name="group.block", timeout=60, concurrency_group="gslots", concurrency_limit=1)
def block(payload, ctx):
    Path(os.environ["TEST_INSIDE_FILE"]).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
