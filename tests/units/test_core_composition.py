"""The execution core is built by composition (issue 36): no class of the core (`cronbox/outbox/engine`,
`events`, `queue`) overrides a method of another class of cronbox's. A family's differences are data
and functions (outbox.engine.outcomes.Family), a store is a module or a plain class implementing a
Protocol, a gate is an object the runner is given. Exceptions (their __init__ carries their fields)
and the ORM's declarative models are not behaviour to override."""
from __future__ import annotations

import ast

from tests.source_tree import shipped

CORE = ("cronbox/outbox/engine/", "cronbox/outbox/events/", "cronbox/outbox/queue/")


def _classes(modules) -> dict[str, tuple[list[str], set[str], str]]:
    """Every class of `modules` ((relative path, tree) pairs) by name: its bases' names, the methods it
    defines, where."""
    found = {}
    for relative, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                found[node.name] = (bases, methods, f"{relative}:{node.lineno}")
    return found


def _is_exception(name: str, classes: dict) -> bool:
    while name in classes:
        if any(b.endswith(("Error", "Exception")) for b in classes[name][0]):
            return True
        name = classes[name][0][0] if classes[name][0] else ""
    return name.endswith(("Error", "Exception"))


def _overrides(classes: dict) -> list[str]:
    overrides = []
    for name, (bases, methods, where) in classes.items():
        if not where.startswith(CORE) or _is_exception(name, classes):
            continue
        for base in bases:
            inherited = set()
            while base in classes:  # cronbox's own classes only: a dependency's is not looked into
                inherited |= classes[base][1]
                base = classes[base][0][0] if classes[base][0] else ""
            if methods & inherited:
                overrides.append(f"{where} {name}: {sorted(methods & inherited)}")
    return overrides


def test_no_class_of_the_core_overrides_a_method_of_another_of_cronbox():
    assert _overrides(_classes((source.relative, source.tree) for source in shipped())) == []


def test_the_check_sees_an_override_two_levels_up_and_leaves_exceptions_and_additions_alone():
    code = ("class A:\n    def f(self): pass\nclass B(A):\n    def g(self): pass\nclass C(B):\n    def f(self): pass\n"
            "class Bad(ValueError):\n    def __init__(self): pass\nclass Worse(Bad):\n    def __init__(self): pass\n")
    classes = _classes([("cronbox/outbox/engine/x.py", ast.parse(code))])
    assert _overrides(classes) == ["cronbox/outbox/engine/x.py:5 C: ['f']"]
