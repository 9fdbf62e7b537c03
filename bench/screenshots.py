"""Regenerate the console screenshots of the docs (docs/_static/console-*.png), never by hand.

    .venv/bin/python bench/screenshots.py

Runs the console's browser test (tests/browser/test_console_browser.py: Debian's chromium driven by
Playwright, on SQLite, against the app served over real HTTP with real ticks in between), which
saves a full-page screenshot of every page it visits, and copies the pages the docs show into
docs/_static/. A picture over 150 KB is not copied (the repository keeps small ones only): the docs
then show the others. Needs /usr/bin/chromium (`apt-get install chromium`) and the test
requirements.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
STATIC = CHECKOUT / "docs" / "_static"
# The pages the console guide shows, in its order (names as the browser test saves them).
PAGES = ("overview", "outbox", "queues", "schedule", "once", "files", "activity", "confirm")
LARGEST = 150 * 1024


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="cronbox-screenshots-") as folder:
        env = {**os.environ, "CRONBOX_TEST_ARTIFACTS": folder}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                               "tests/browser/test_console_browser.py", "-k", "sqlite"], cwd=str(CHECKOUT), env=env)
        if done.returncode != 0:
            print("screenshots: the browser test failed; docs/_static left as it was", file=sys.stderr)
            return 1
        shots = Path(folder) / "console" / "sqlite"
        for name in PAGES:
            source, target = shots / f"{name}.png", STATIC / f"console-{name}.png"
            size = source.stat().st_size
            if size > LARGEST:
                target.unlink(missing_ok=True)
                print(f"screenshots: {name} is {size // 1024} KB, over {LARGEST // 1024} KB: not kept")
                continue
            shutil.copyfile(source, target)
            print(f"screenshots: {target.relative_to(CHECKOUT)} ({size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
