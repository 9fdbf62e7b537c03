"""Our rule, the part an import check cannot see: a private name reached by a string,
`getattr(raw, "_force_close")` or `setattr(obj, "_x", ...)`, is how a use of another package's
internals hides from a reader and from grep. Shipped code makes no such lookup (for its own objects
it has no need to: it names the attribute)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [p for d in ("cronbox",) for p in sorted((ROOT / d).rglob("*.py"))] + [ROOT / "app.py"]
LOOKUPS = {"getattr", "setattr", "hasattr", "delattr"}


def private_lookups(source: str) -> list[str]:
    """The private attribute names `source` reaches through getattr/setattr/hasattr/delattr with a
    literal name (dunders such as `__qualname__` are the language's, not a package's)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in LOOKUPS
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            name = node.args[1].value
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                found.append(name)
    return found


@pytest.mark.parametrize("source, expected", [
    ('getattr(raw, "_force_close", None)', ["_force_close"]), ('setattr(obj, "_cache", 1)', ["_cache"]),
    ('hasattr(x, "_y")', ["_y"]), ('getattr(context, "lock_file_fd")', []),
    ('getattr(fn, "__qualname__", None)', []), ('getattr(x, name)', []), ('x._y', []),
])
def test_the_check_sees_private_lookups_by_string(source, expected):
    assert private_lookups(source) == expected


def test_shipped_code_looks_up_no_private_attribute_by_string():
    offenders = {str(p.relative_to(ROOT)): hits for p in SHIPPED
                 if (hits := private_lookups(p.read_text(encoding="utf-8")))}
    assert offenders == {}
