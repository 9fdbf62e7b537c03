"""Importing cronbox (every process does, a tick included) loads no Flask: checked in a fresh interpreter."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import APP_ROOT, child_env


def test_importing_cronbox_and_its_command_line_loads_no_flask():
    code = ("import sys, cronbox, cronbox.cron.cli, cronbox.outbox, cronbox.storage; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'werkzeug')))")
    proc = subprocess.run([sys.executable, "-c", code], env=child_env({}), cwd=str(APP_ROOT), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
