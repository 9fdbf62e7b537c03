"""Write a benchmark's numbers into docs/benchmarks.md, in its own marked section.

Each section is replaced whole on every run, so the file always shows the
latest numbers with the command and date that produced them.
"""
from __future__ import annotations

import platform
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = """# Benchmarks

Numbers printed by the scripts in `bench/`, each section rewritten by its script. They are measured
on the development machine (2 cores, MariaDB 10.11 on loopback with every commit flushed, SQLite in
WAL mode), never asserted in tests. Rerun a section with the command shown under it.
"""


def machine() -> str:
    try:
        maria = subprocess.run(["mariadb", "--version"], capture_output=True, text=True, timeout=5).stdout.split()
        server = next((w for w in maria if "MariaDB" in w), "MariaDB ?")
    except Exception:
        server = "MariaDB ?"
    return f"Python {platform.python_version()}, {server.rstrip(',')}, {platform.machine()}"


def write_section(key: str, title: str, command: str, body: str) -> None:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    replace_section(key, f"## {title}\n\n`{command}` — {stamp}, {machine()}\n\n{body.strip()}\n")


def replace_section(key: str, markdown: str) -> None:
    """Put `markdown` (starting with its "## " heading) between this section's markers."""
    DOC.parent.mkdir(exist_ok=True)
    text = DOC.read_text() if DOC.exists() else HEADER
    section = f"<!-- bench:{key} -->\n{markdown.strip()}\n<!-- /bench:{key} -->"
    pattern = re.compile(rf"<!-- bench:{re.escape(key)} -->.*?<!-- /bench:{re.escape(key)} -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    DOC.write_text(text)
