"""The docs' reference is the code's (issue 37): every public name, command, option, setting, table and
metric appears in it, so a new one without documentation fails here, and the docs build (.ci/run,
`sphinx-build -W`) fails on a public name without a docstring.

The generated pages' Markdown comes from docs/_ext/cronbox_reference.py, whose functions need no
Sphinx; the build itself runs in the docs' own virtualenv (requirements-docs.txt).
"""
from __future__ import annotations

import ast
import importlib.util
import re

import click

import cronbox
from cronbox.cron.cli import cli
from cronbox.cron.scheduling.metrics import FAMILIES
from cronbox.outbox.core.settings_table import BY_NAME, PARTS, SETTINGS
from tests.conftest import APP_ROOT

DOCS = APP_ROOT / "docs"
SETTING = re.compile(r"^(CRONBOX_[A-Z0-9_]*[A-Z0-9]|DATABASE_URL)$")


def reference_module():
    spec = importlib.util.spec_from_file_location("cronbox_reference", DOCS / "_ext" / "cronbox_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def settings_the_code_reads() -> set[str]:
    """Every string constant of the package (and the standalone app) that is a setting's whole name, the
    names the web parts build from PARTS, and those artisan_via_cron.sh reads."""
    names = set()
    sources = [*sorted((APP_ROOT / "cronbox").rglob("*.py")), APP_ROOT / "app.py", APP_ROOT / "passenger_wsgi.py"]
    for path in sources:
        if path.name == "settings_table.py":
            continue  # the table itself
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SETTING.match(node.value):
                names.add(node.value)
    names |= {f"CRONBOX_{part.upper()}{suffix}" for part in PARTS for suffix in ("", "_PREFIX")}
    script = (APP_ROOT / "cronbox" / "cron" / "artisan_via_cron.sh").read_text(encoding="utf-8")
    names |= set(re.findall(r"\b(CRONBOX_[A-Z0-9_]*[A-Z0-9])\b", script))
    return names


def test_every_setting_the_code_reads_is_in_the_table_and_every_row_is_read():
    read = settings_the_code_reads()
    assert len(read) >= 80, sorted(read)  # the scan sees the code
    assert sorted(read - set(BY_NAME)) == [], "settings the code reads without a row in settings_table.SETTINGS"
    assert sorted(set(BY_NAME) - read) == [], "rows of settings_table.SETTINGS no code reads"


def test_the_settings_reference_shows_every_setting_with_its_default_and_meaning():
    page = (DOCS / "reference" / "settings.md").read_text(encoding="utf-8")
    assert "```{cronbox-settings}" in page
    rendered = reference_module().settings_markdown()
    for setting in SETTINGS:
        [row] = [line for line in rendered.splitlines() if line.startswith(f"| `{setting.name}` |")]
        assert setting.meaning.split()[0] in row and row.count("|") >= 4, row
        assert setting.default and setting.meaning.strip(), setting.name


def test_every_public_name_is_in_the_api_reference():
    page = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\.\. (?:autofunction|autoclass|autoexception|py:module):: (cronbox\.[\w.]+)$",
                                page, re.M))
    assert sorted(f"cronbox.{name}" for name in cronbox.__all__ if f"cronbox.{name}" not in documented) == []
    for name in ("put", "grant", "signed_url", "revoke", "open_file"):
        assert f"cronbox.storage.{name}" in documented


def test_every_public_name_has_a_docstring_of_its_own():
    """What autodoc shows: a class's own docstring, not the one a dataclass or a base class gives it."""
    for name in cronbox.__all__:
        value = getattr(cronbox, name)
        own = value.__dict__.get("__doc__") if isinstance(value, type) else getattr(value, "__doc__", None)
        assert own and own.strip() and not own.startswith(f"{name}("), f"cronbox.{name} has no docstring of its own"


def commands(command: click.Command = cli, path: tuple[str, ...] = ()):
    ctx = click.Context(command, info_name=" ".join(path) or "cronbox")
    yield path, command
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            yield from commands(command.get_command(ctx, name), (*path, name))


def test_every_command_and_option_is_documented_by_its_own_help():
    """docs/reference/commands.md is sphinx-click's rendering of the whole tree, so what each command and
    option says there is its help: none may be missing."""
    page = (DOCS / "reference" / "commands.md").read_text(encoding="utf-8")
    assert ".. click:: cronbox.cron.cli:cli" in page and ":nested: full" in page
    seen = list(commands())
    assert len(seen) >= 50, [p for p, _ in seen]
    for path, command in seen:
        assert (command.help or "").strip(), f"`{' '.join(path)}` has no help"
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert (param.help or "").strip(), f"`{' '.join(path)} {param.opts[0]}` has no help"


def test_every_metric_and_table_is_in_the_reference():
    from cronbox.cron import schema

    module = reference_module()
    assert "```{cronbox-metrics}" in (DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    assert "```{cronbox-tables}" in (DOCS / "reference" / "tables.md").read_text(encoding="utf-8")
    metrics = module.metrics_markdown()
    assert [name for name in FAMILIES if f"| `{name}` |" not in metrics] == []
    tables = module.tables_markdown()
    assert [name for name in schema.metadata.tables if f"## `{name}`" not in tables] == []
    assert module.undocumented_tables() == []


def test_the_console_guide_shows_the_screenshots_the_command_makes():
    """bench/screenshots.py copies the pages the console guide captions, no more, no fewer; the guide shows
    those present in docs/_static/."""
    from bench.screenshots import PAGES

    module = reference_module()
    assert tuple(module.CAPTIONS) == PAGES
    assert "```{cronbox-screenshots}" in (DOCS / "howto" / "console.md").read_text(encoding="utf-8")
    shown = module.screenshots_markdown()
    for name in PAGES:
        assert (f"console-{name}.png" in shown) == (DOCS / "_static" / f"console-{name}.png").is_file()


def public_callables():
    """Each public function (and the extension's constructor and init_app), with its docstring: what
    the API reference shows for it."""
    import inspect

    from cronbox import storage

    for name in cronbox.__all__:
        value = getattr(cronbox, name)
        if isinstance(value, type):
            if name == "Cronbox":
                yield "Cronbox", value.__init__, inspect.getdoc(value)
                yield "Cronbox.init_app", value.init_app, inspect.getdoc(value.init_app)
        elif callable(value):
            yield name, value, inspect.getdoc(value)
    for name in ("put", "grant", "signed_url", "revoke", "open_file"):
        yield f"storage.{name}", getattr(storage, name), inspect.getdoc(getattr(storage, name))


def test_every_parameter_of_the_public_api_is_named_in_its_docstring():
    """Docstrings of the public API are complete (issue 37): each parameter is named in its function's
    docstring (`registry` is the tests' own, `hooks` init_app's, named there)."""
    import inspect

    missing = []
    for name, function, doc in public_callables():
        for parameter in inspect.signature(function).parameters:
            if parameter not in ("self", "registry", "hooks") and not re.search(rf"\b{parameter}\b", doc or ""):
                missing.append(f"{name}({parameter})")
    assert missing == []
