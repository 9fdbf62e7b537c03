"""Reference pages generated from cronbox's own code, and the build's completeness checks.

Directives (Markdown pages use them as ```{cronbox-settings}``` blocks):

- `cronbox-settings`: every setting, from cronbox.outbox.core.settings_table.SETTINGS;
- `cronbox-tables`: every database table, from cronbox.cron.schema.metadata and the models' docstrings;
- `cronbox-metrics`: every family `GET /metrics` shows, from cronbox.cron.scheduling.metrics.FAMILIES;
- `cronbox-screenshots`: the console's pages as bench/screenshots.py saved them (docs/_static/console-*.png).

At the end of reading, every name of `cronbox.__all__` must have been documented by autodoc (a warning,
so an error under `-W`, names the missing ones), and so must every model's table have a docstring.

The Markdown each directive renders is made by plain functions (`settings_markdown()`...), importable
without Sphinx: tests/units/test_docs_reference.py checks them against the code.
"""
from __future__ import annotations

import inspect
from collections.abc import Iterator


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def settings_markdown() -> str:
    from cronbox.outbox.core.settings_table import GROUPS, KINDS, SETTINGS

    out: list[str] = []
    for group, title in GROUPS.items():
        rows = [s for s in SETTINGS if s.group == group]
        if not rows:
            continue
        out += [f"## {title}", "", "| setting | default | what it is |", "|---|---|---|"]
        for s in rows:
            default = s.default if " " in s.default or "`" in s.default else f"`{s.default}`"
            out.append(f"| `{s.name}` | {_cell(default)} | {_cell(s.meaning)} *({_cell(KINDS[s.kind])})* |")
        out.append("")
    return "\n".join(out)


def _models() -> dict[str, type]:
    from cronbox.cron import schema  # registers every family's models on the one metadata
    from cronbox.outbox.core.models import Base

    assert schema.metadata is Base.metadata
    return {mapper.local_table.name: mapper.class_ for mapper in Base.registry.mappers}


def undocumented_tables() -> list[str]:
    """Tables whose model says nothing about what a row is (no docstring of its own)."""
    return sorted(name for name, cls in _models().items() if not cls.__dict__.get("__doc__"))


def tables_markdown() -> str:
    from cronbox.cron import schema

    models = _models()
    out: list[str] = []
    for table in sorted(schema.metadata.tables.values(), key=lambda t: t.name):
        model = models.get(table.name)
        doc = inspect.cleandoc(model.__dict__.get("__doc__") or "") if model is not None else ""
        out += [f"## `{table.name}`", ""]
        if doc:
            out += [" ".join(doc.split("\n\n", 1)[0].split()), ""]
        out += ["| column | type | null | |", "|---|---|---|---|"]
        for column in table.columns:
            notes = []
            if column.primary_key:
                notes.append("primary key")
            for fk in column.foreign_keys:
                notes.append(f"→ `{fk.target_fullname}`")
            if column.unique:
                notes.append("unique")
            out.append(f"| `{column.name}` | {_cell(column.type)} | {'yes' if column.nullable else 'no'} | "
                       f"{', '.join(notes)} |")
        indexes = sorted(table.indexes, key=lambda i: i.name or "")
        uniques = [c for c in table.constraints if c.__class__.__name__ == "UniqueConstraint"]
        if indexes or uniques:
            out.append("")
            for index in indexes:
                kind = "unique index" if index.unique else "index"
                out.append(f"- {kind} `{index.name}` on {', '.join(f'`{c.name}`' for c in index.columns)}")
            for unique in uniques:
                out.append(f"- unique `{unique.name}` on {', '.join(f'`{c.name}`' for c in unique.columns)}")
        out.append("")
    return "\n".join(out)


def metrics_markdown() -> str:
    from cronbox.cron.scheduling.metrics import FAMILIES

    out = ["| metric | labels | what it is |", "|---|---|---|"]
    for name, (labels, help_text) in FAMILIES.items():
        text = help_text.replace("{span}", "the last `CRONBOX_METRICS_WINDOW`")
        out.append(f"| `{name}` | {', '.join(f'`{label}`' for label in labels) or '—'} | {_cell(text)} |")
    return "\n".join(out) + "\n"


CAPTIONS = {
    "overview": "Overview: health checks, backlogs, recent ticks and the 24-hour chart",
    "outbox": "Outbox: deliveries per consumer, dead deliveries to retry or skip",
    "queues": "Queues: jobs per queue, paused channels, failed jobs to retry, forget or flush",
    "schedule": "Schedule: tasks, last run, next due, Run now",
    "once": "One-off runs: ask for an allow-listed command, see its output",
    "files": "Files: the access audit, grants to revoke, the upload form",
    "activity": "Activity: every action and login, with operator, time and IP",
    "confirm": "A destructive action asks first",
}


def screenshots_markdown(static=None) -> str:
    """The console screenshots bench/screenshots.py made (docs/_static/console-*.png), those present."""
    from pathlib import Path

    static = Path(static or Path(__file__).resolve().parent.parent / "_static")
    shown = [f"```{{figure}} ../_static/console-{name}.png\n:alt: {caption}\n\n{caption}\n```\n"
             for name, caption in CAPTIONS.items() if (static / f"console-{name}.png").is_file()]
    return "\n".join(shown) or ("No screenshots in this copy: `python bench/screenshots.py` makes them "
                                "from the console's browser test.\n")


def public_names() -> list[str]:
    import cronbox

    return [f"cronbox.{name}" for name in cronbox.__all__]


GENERATORS = {"cronbox-settings": settings_markdown, "cronbox-tables": tables_markdown,
              "cronbox-metrics": metrics_markdown, "cronbox-screenshots": screenshots_markdown}


def _documented_objects(env) -> Iterator[str]:
    yield from env.domains["py"].objects  # every object autodoc described, by its full name
    yield from (name for name, *_ in env.domains["py"].modules.items())


def setup(app):
    from docutils.parsers.rst import Directive
    from sphinx.util import logging

    log = logging.getLogger(__name__)

    def directive(generate):
        class Generated(Directive):
            has_content = False

            def run(self):
                from docutils import nodes
                from docutils.statemachine import StringList

                container = nodes.container()
                self.state.nested_parse(StringList(generate().splitlines(), source="cronbox code"),
                                        self.content_offset, container, match_titles=True)
                return container.children

        return Generated

    for name, generate in GENERATORS.items():
        app.add_directive(name, directive(generate))

    def check_completeness(app, env):
        documented = set(_documented_objects(env))
        missing = [name for name in public_names() if name not in documented]
        if missing:
            log.warning("public names without reference documentation (docs/reference/api.md): %s",
                        ", ".join(missing))
        for table in undocumented_tables():
            log.warning("the model of table %s has no docstring (docs/reference/tables.md shows it)", table)

    app.connect("env-check-consistency", check_completeness)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
