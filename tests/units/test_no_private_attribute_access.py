"""Our rule, where it is easiest to break: `obj._name` on an object that is not our own. Shipped code
reaches a private attribute only through `self`, `cls` or `super()`; the few documented exceptions
below are public by their owners' documentation despite the underscore (each says where)."""
from __future__ import annotations

import ast

from tests.source_tree import shipped

DOCUMENTED = {
    "os._exit": "the standard library's documented exit for a forked child (docs.python.org, os._exit)",
    "current_app._get_current_object": "Flask's documented way to the object behind a proxy (Notes on Proxies)",
    "current_request._get_current_object": "the same, for flask.request",
}


def private_accesses(nodes) -> list[str]:
    """`obj._name` among these nodes (a module's), for any obj but self, cls and super()."""
    found = []
    for node in nodes:
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                continue
            found.append(ast.unparse(node))
    return found


def test_the_check_sees_a_private_attribute_of_another_object():
    assert private_accesses(ast.walk(ast.parse("engine.dialect._savepoint(conn)"))) == ["engine.dialect._savepoint"]
    assert private_accesses(ast.walk(ast.parse("raw._sock.close()"))) == ["raw._sock"]
    assert private_accesses(ast.walk(ast.parse("self._lock.release(); super()._ack(x); cls._made"))) == []


def test_shipped_code_reaches_no_private_attribute_of_another_object():
    offenders = {}
    for source in shipped():
        hits = [h for h in private_accesses(source.nodes) if not any(h.endswith(allowed) for allowed in DOCUMENTED)]
        if hits:
            offenders[source.relative] = hits
    assert offenders == {}
