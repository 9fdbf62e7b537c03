"""The project's Python files, each read and parsed once per test process: the policy checks (imports
point one way, no private names of other packages, no old spellings) all walk the same trees, and
parsing the whole package is most of what they cost."""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_FOLDERS = ("cronbox",)
SHIPPED_FILES = ("app.py", "passenger_wsgi.py")  # the standalone app, beside the package


@dataclass(frozen=True)
class Source:
    path: Path
    text: str
    tree: ast.Module

    @property
    def relative(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    @functools.cached_property
    def nodes(self) -> tuple[ast.AST, ...]:
        """Every node of the tree, in ast.walk's order."""
        return tuple(ast.walk(self.tree))


@functools.cache
def parsed(path: Path) -> Source:
    text = path.read_text(encoding="utf-8")
    return Source(path, text, ast.parse(text, filename=str(path)))


@functools.cache
def shipped() -> tuple[Source, ...]:
    """Everything a user runs: the package's modules (migrations too) and the standalone app."""
    paths = [p for folder in SHIPPED_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    return tuple(parsed(p) for p in paths + [ROOT / name for name in SHIPPED_FILES])


def project(*folders: str) -> tuple[Source, ...]:
    """The Python files under these folders of the checkout (tests, bench, examples...)."""
    return tuple(parsed(p) for folder in folders for p in sorted((ROOT / folder).rglob("*.py")))
