"""Imports point one way (cronbox.outbox <- cronbox.storage <- cronbox.cron <- the rest of cronbox <- app.py)
and no module cycles.

Every project module is parsed (not imported), so an import inside a function counts as much as
one at the top: a lazy import that closes a cycle only hides it until someone calls that function.
A submodule importing names from one of its own packages (`from . import bp` in `cronbox/ops/guard.py`)
is exempt: with its package importing it in turn (`cronbox/outbox/__init__.py` exposing `load_settings`) that
pair is how Python packages work, not a cycle. Longer rings through a package are real cycles: `cronbox.cron.cli`
importing `cronbox.cron.commands`, whose modules import `cronbox.cron.cli`, runs half-initialised modules.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.source_tree import parsed, shipped

ROOT = Path(__file__).resolve().parents[2]
# The layers, lowest first: a module may import its own layer and the ones below it, never above.
LAYERS = ["cronbox.outbox", "cronbox.storage", "cronbox.cron", "cronbox.web", "cronbox", "app"]
SOURCES = ["cronbox", "app.py", "passenger_wsgi.py"]  # cronbox/cron/ holds migrations/
SUBPACKAGES = ("outbox", "storage", "cron")  # cronbox's subpackages: never importable by these names alone
OLD_IMPORT = re.compile(r"\s*(from\s+(outbox|storage|cron)[.\s]|import\s+([\w.]+\s*,\s*)*(outbox|storage|cron)\b)")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    modules = {}
    for source in SOURCES:
        target = ROOT / source
        paths = [target] if target.is_file() else sorted(target.rglob("*.py"))
        for path in paths:
            if "versions" in path.parts:  # migration scripts are loaded by Alembic, not imported
                continue
            modules[module_name(path)] = path
    return modules


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `module` imports, anywhere in its body."""
    source = parsed(path)
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def closest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    for node in source.nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = closest(alias.name)
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            base = (_resolve_relative(module, is_package, node.level, node.module) if node.level
                    else node.module or "")
            for alias in node.names:
                # `from pkg import sub` imports the submodule when there is one, else a name of pkg.
                target = closest(f"{base}.{alias.name}") if f"{base}.{alias.name}" in known else closest(base)
                if target:
                    found.add(target)
    found.discard(module)
    return found


def exempt(importer: str, imported: str) -> bool:
    """A submodule taking names from one of its own packages."""
    return importer.startswith(imported + ".")


def layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] == "passenger_wsgi":
        return LAYERS.index("app")
    for name in (".".join(parts[:2]), parts[0]):
        if name in LAYERS:
            return LAYERS.index(name)
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: {t for t in imported_modules(name, path, known) if not exempt(name, t)}
            for name, path in modules.items()}


def test_the_parser_sees_imports_inside_functions_and_relative_ones(graph, tmp_path):
    # Guards the test itself: if these edges vanished, every check below would pass vacuously.
    assert "cronbox.cron.scheduling.health" in graph["cronbox.cron.commands.tick"]  # imported inside tick()
    assert len(graph) > 60
    module = tmp_path / "probe.py"
    module.write_text("from . import clock\n"
                      "def later():\n    from cronbox.outbox.events import relay\n    import cronbox.storage.vault as v\n")
    known = {"cronbox.outbox.core.clock", "cronbox.outbox.events", "cronbox.outbox.events.relay", "cronbox.storage",
             "cronbox.storage.vault"}
    assert imported_modules("cronbox.outbox.core.probe", module, known) == {
        "cronbox.outbox.core.clock", "cronbox.outbox.events.relay", "cronbox.storage.vault"}


def test_imports_point_one_way(graph):
    against = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                     if layer(a) is not None and layer(b) is not None and layer(b) > layer(a))
    assert against == [], "imports against cronbox.outbox <- .storage <- .cron <- cronbox <- app.py:\n" + "\n".join(against)


# Rooms of cronbox.outbox that stand beside others, not on them: the job queue and the AMQP transport
# never import the event outbox (nor the transport the job queue), so either can change alone (issue 36).
APART = {
    "cronbox.outbox.queue": ("cronbox.outbox.events",),
    "cronbox.outbox.amqp": ("cronbox.outbox.events", "cronbox.outbox.queue"),
}


def test_the_job_queue_and_the_transport_import_nothing_of_the_event_outbox(graph):
    assert "cronbox.outbox.amqp.consumer_link" in graph["cronbox.outbox.queue.broker_worker"]  # the check sees them
    against = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                     for room, kept_out in APART.items() if a.startswith(room + ".")
                     if any(b == k or b.startswith(k + ".") for k in kept_out))
    assert against == [], "imports between rooms kept apart:\n" + "\n".join(against)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the groups of modules that import each other in a ring."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def test_no_import_cycles(graph):
    cycles = strongly_connected(graph)
    assert cycles == [], "modules importing each other in a ring:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_ring():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_nothing_imports_the_folders_by_their_own_names():
    """outbox/, storage/ and cron/ are cronbox.outbox, cronbox.storage and cronbox.cron, in a checkout as
    installed (issues 26, 36): nothing imports them by their own names, which no longer exist."""
    offenders = []
    for source in shipped():
        for node in source.nodes:
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{source.relative}:{node.lineno}: {name}" for name in names
                          if name.split(".")[0] in SUBPACKAGES]
    # Tests, bench and examples by their import lines (parsing them all would cost the unit tier seconds).
    for path in (p for folder in ("tests", "bench", "examples") for p in sorted((ROOT / folder).rglob("*.py"))):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OLD_IMPORT.match(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
