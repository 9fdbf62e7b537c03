"""The code blocks of README.md and the docs pages, as the tests that run them find them.

Every ```python and shell (sh, bash, shell, console) block is one of:
- an excerpt of the example app: its first line `# examples/<path>.py` (or `... (abridged)`); its lines
  are that file's, in order (tests/db/test_readme.py), and examples/clinic's own tests run them;
- run by a test: the line above it is `<!-- run: tests/<module>.py -->`, and that module takes it with
  `snippet(page, mark)` (the one block of the page holding `mark`);
- not runnable: the line above it is `<!-- not run: <the reason> -->`.
tests/units/test_docs_snippets.py checks that every block is one of these, and that a block marked
run is taken by the module it names. Other blocks (`text`, `ini`, `yaml`, the file format's
pseudo-code without a language) are not code to run; one without a language that reads like a
command line is refused: say `sh` and mark it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import APP_ROOT

RUNNABLE = ("python", "sh", "bash", "shell", "console")
BLOCK = re.compile(r"(?:^[ \t]*<!-- (?P<kind>run|not run): *(?P<why>.*?) *-->\n)?"
                   r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
                   re.M | re.S)
EXCERPT = re.compile(r"# (examples/\S+\.py)( \(abridged\))?\n")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the checkout: README.md, docs/howto/jobs.md
    line: int
    language: str
    code: str
    kind: str | None  # "run", "not run" or None
    why: str  # the test module (run) or the reason (not run)
    directive: bool = False  # a MyST directive (```{toctree}), not code

    @property
    def excerpt(self) -> str | None:
        found = EXCERPT.match(self.code)
        return found.group(1) if found else None


def pages() -> list[str]:
    docs = sorted(p for p in (APP_ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    top = [name for name in ("README.md", "CHANGELOG.md") if (APP_ROOT / name).is_file()]
    return [*top, *(str(p.relative_to(APP_ROOT)) for p in docs)]


def blocks(page: str) -> list[Block]:
    text = (APP_ROOT / page).read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        indent = match.group("indent")
        code = "".join(line[len(indent):] if line.startswith(indent) else line
                       for line in match.group("code").splitlines(keepends=True))
        info = match.group("info").strip()
        language = "" if info.startswith("{") else info.split(" ")[0]  # {toctree}...: a directive, not code
        found.append(Block(page, text.count("\n", 0, match.start("indent")) + 1, language, code,
                           match.group("kind"), match.group("why") or "", info.startswith("{")))
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def snippet(page: str, mark: str) -> str:
    """The one runnable block of `page` that holds `mark`."""
    found = [b for b in blocks(page) if b.language in RUNNABLE and mark in b.code]
    assert len(found) == 1, f"{page}: {len(found)} blocks hold {mark!r}"
    return found[0].code


def section(page: str, heading: str) -> str:
    """The text of `page` under `heading` (a whole heading line), up to the next heading of its level."""
    text = (APP_ROOT / page).read_text(encoding="utf-8")
    level = heading.split(" ", 1)[0]
    after = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n{level} ", after, maxsplit=1)[0]


def all_text() -> str:
    return "\n".join((APP_ROOT / page).read_text(encoding="utf-8") for page in pages())


def path_of(page: str) -> Path:
    return APP_ROOT / page
