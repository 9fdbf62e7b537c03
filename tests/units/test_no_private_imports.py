"""Our rule: cronbox never uses a private name of another package, the standard library's included
(`_signal` for `signal`, `pymysql._auth`, `from x import _y`). Checked on every import statement of
the shipped code, since a private import is where such a use starts."""
from __future__ import annotations

import ast

import pytest

from tests.source_tree import shipped

OURS = {"cronbox", "app"}
# No known exceptions: issue 25 removed the last ones (pymysql._auth, nacl._sodium).
KNOWN: dict[str, list[str]] = {}


def private_imports(nodes) -> list[str]:
    """The private names of other packages that these nodes (a module's) import, as written."""
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            modules = [(node.module, [alias.name for alias in node.names])]
        else:
            continue  # relative imports are ours
        for module, names in modules:
            if module.split(".")[0] in OURS:
                continue
            parts = module.split(".") + names
            if any(part.startswith("_") for part in parts):
                found.append(module)
    return found


@pytest.mark.parametrize("source, expected", [
    ("import _signal", 1), ("import signal, _thread", 1), ("from _signal import getsignal", 1),
    ("from pymysql import _auth", 1), ("from sqlalchemy.engine import _row_cy", 1),
    ("import sqlalchemy._x.y", 1),
    ("import signal", 0), ("from __future__ import annotations", 0), ("from cronbox.outbox.core import _x", 0), ("from outbox.core import _x", 1),
    ("from . import _private", 0), ("from sqlalchemy.engine import Connection", 0),
])
def test_the_check_sees_private_imports(source, expected):
    assert len(private_imports(ast.walk(ast.parse(source)))) == expected


def test_shipped_code_imports_no_private_name_of_another_package():
    offenders = {source.relative: hits for source in shipped() if (hits := private_imports(source.nodes))}
    assert offenders == KNOWN
