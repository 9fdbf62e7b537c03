"""Our rule, the part an import check cannot see: a private name reached by a string,
`getattr(raw, "_force_close")` or `setattr(obj, "_x", ...)`, is how a use of another package's
internals hides from a reader and from grep. Shipped code makes no such lookup (for its own objects
it has no need to: it names the attribute)."""
from __future__ import annotations

import ast

import pytest

from tests.source_tree import shipped

LOOKUPS = {"getattr", "setattr", "hasattr", "delattr"}


def private_lookups(nodes) -> list[str]:
    """The private attribute names `source` reaches through getattr/setattr/hasattr/delattr with a
    literal name (dunders such as `__qualname__` are the language's, not a package's)."""
    found = []
    for node in nodes:
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
    assert private_lookups(ast.walk(ast.parse(source))) == expected


def test_shipped_code_looks_up_no_private_attribute_by_string():
    offenders = {source.relative: hits for source in shipped() if (hits := private_lookups(source.nodes))}
    assert offenders == {}
