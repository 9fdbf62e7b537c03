"""Every string cronbox ships (messages, docstrings, click help, error texts, f-string parts) names the
0.7 public API where it tells a user what to write: `cronbox.consumer`, `from cronbox import record`,
`python -m cronbox COMMAND` (issue 35, item 10: the refusal of a consumer without `runs=` told users to
write `@outbox.consumer(...)`, a spelling 0.7 no longer installs). Checked on the source with `ast`,
so a new message in the old spelling fails here, not in a user's cron mail.

Internal cross-references in docstrings (`outbox.engine.run_loop`, `storage.display`) name modules of
the checkout for its readers, not a user's spelling, and are not matched."""
from __future__ import annotations

import ast
import re

import pytest

import cronbox
from tests.source_tree import shipped

OLD_PACKAGES = "outbox|storage|cron"
# What a user would write in the spelling before 0.7 (README, "Upgrading to 0.7"), as classes:
OLD_SPELLINGS = re.compile("|".join(f"(?:{pattern})" for pattern in (
    # a public name reached through the old package: outbox.consumer, @outbox.job, outbox.RetryLater, ...
    rf"\boutbox\.(?:{'|'.join(sorted(cronbox.__all__))}|dispatch)\b",
    r"@outbox\.",
    # importing the old top-level packages (`from cronbox import storage` is 0.7's own)
    rf"(?<!cronbox )\bimport (?:{OLD_PACKAGES})\b",
    rf"\bfrom (?:{OLD_PACKAGES})(?:\.\w+)* import\b",
    # the old command line
    rf"\bpython3? -m (?:{OLD_PACKAGES})\b",
    # the modules a user names in settings or in the host's Alembic env.py
    r"(?<![\w.])cron\.(?:demo|schema)\b",
    # the module a message names as the one a user imported
    rf"\bmodule '(?:{OLD_PACKAGES})'",
)))
def old_spellings(nodes) -> list[tuple[int, str]]:
    """(line, match) for each old spelling in a str constant of `source` (docstrings, messages and the
    literal parts of f-strings alike), and in code a user copies (the demo's `@outbox.consumer`)."""
    found = []
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, match.group(0)) for match in OLD_SPELLINGS.finditer(node.value)]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            found += [(node.lineno, match.group(0)) for match in OLD_SPELLINGS.finditer(ast.unparse(node))]
    return found


@pytest.mark.parametrize("source, expected", [
    ('raise E(f"{name!r}: say where it runs, @outbox.consumer(..., runs=\\"tick\\")")', ["@outbox."]),
    ('"""Example:\n\n    outbox.record(session, "a", {})\n"""', ["outbox.record"]),
    ('x = "cronbox.outbox.job(...)"', ["outbox.job"]),
    ('x = "outbox.RetryLater"', ["outbox.RetryLater"]),
    ('help = "the VPS side of outbox.forward"', ["outbox.forward"]),
    ('"""    from cronbox import outbox\n    import outbox\n"""', ["import outbox"]),
    ('x = "from cron.scheduling import schedule"', ["from cron.scheduling import"]),
    ('x = "run python -m cron tick"', ["python -m cron"]),
    ('x = "python3 -m outbox"', ["python3 -m outbox"]),
    ('x = "CRONBOX_HANDLERS=cron.demo"', ["cron.demo"]),
    ('x = f"module \'storage\' has no attribute {name!r}"', ["module 'storage'"]),
    ("from cronbox import outbox\n@outbox.consumer('a', name='b')\ndef f(e, c): outbox.record(c.session, 'a', {})",
     ["outbox.consumer", "outbox.record"]),
    # 0.7's own spellings, and internal cross-references, are not matched
    ('x = "@cronbox.consumer(..., runs=\\"tick\\"); python -m cronbox tick; cronbox.cron.demo"', []),
    ('x = "from cronbox import storage; storage.put(...); from cronbox import record"', []),
    ('x = "(outbox.engine.run_loop) run from cron with --stop-when-empty; flask --app app cron tick"', []),
    ('x = "health checks outbox.backlog, outbox.dead"', []),
    ("@outbox.command()\ndef status(): storage.put(s, f)", []),
])
def test_the_check_sees_the_old_spellings(source, expected):
    assert [match for _, match in old_spellings(ast.walk(ast.parse(source)))] == expected


def test_the_check_reads_every_module_of_the_package():
    sources = {source.relative for source in shipped()}
    assert {"cronbox/__init__.py", "cronbox/outbox/events/placement.py", "cronbox/storage/__init__.py",
            "cronbox/cron/cli.py", "cronbox/cron/migrations/env.py"} <= sources


def test_no_shipped_string_names_a_spelling_before_0_7():
    offenders = [f"{source.relative}:{line}: {match}" for source in shipped() for line, match in old_spellings(source.nodes)]
    assert offenders == []
