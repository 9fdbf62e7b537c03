"""Every Python and shell block of the docs is run by a test or says why not (issue 37).

tests/docs_snippets.py reads the blocks of README.md, CHANGELOG.md and docs/; a block is an excerpt
of examples/ (checked line by line in tests/db/test_readme.py), marked `<!-- run: tests/... -->` by
the test module that takes it, or marked `<!-- not run: reason -->`.
"""
from __future__ import annotations

import re

from tests.conftest import APP_ROOT
from tests.docs_snippets import RUNNABLE, all_blocks, blocks, pages

COMMAND_LINE = re.compile(r"^(\$ |python3? |pip |\.?venv/|\.venv/|cd |export |sudo |cronbox )")


def test_the_pages_are_found_and_hold_blocks():
    found = pages()
    assert "README.md" in found and "docs/tutorial.md" in found and "docs/howto/jobs.md" in found
    assert len([b for b in all_blocks() if b.language in RUNNABLE]) >= 25


def test_every_python_and_shell_block_is_run_by_a_test_or_says_why_not():
    unmarked = [f"{b.page}:{b.line}" for b in all_blocks()
                if b.language in RUNNABLE and not b.kind and not b.excerpt]
    assert unmarked == [], "mark these <!-- run: tests/... --> or <!-- not run: reason -->"
    for block in all_blocks():
        if block.kind == "not run":
            assert len(block.why.split()) >= 4, f"{block.page}:{block.line}: say why it is not run"


def test_a_block_marked_run_is_taken_by_the_module_it_names():
    for block in all_blocks():
        if block.kind != "run":
            continue
        module = APP_ROOT / block.why
        assert block.why.startswith("tests/") and module.is_file(), f"{block.page}:{block.line}: {block.why}"
        assert block.page in module.read_text(encoding="utf-8"), (
            f"{block.why} never names {block.page}: it does not run the block at {block.page}:{block.line}")


def test_a_block_without_a_language_is_no_command_line():
    """A shell snippet has to say `sh` to be counted (and marked)."""
    for block in all_blocks():
        if not block.language and not block.directive:
            assert not COMMAND_LINE.match(block.code), f"{block.page}:{block.line}: label it sh and mark it"


def test_the_marks_are_read_as_written(tmp_path, monkeypatch):
    import tests.docs_snippets as docs_snippets

    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- not run: it needs your broker running -->\n```sh\npython -m cronbox amqp work\n```\n\n"
                    "```python\n# examples/clinic/clinic/views.py (abridged)\nx = 1\n```\n\n  ```sh\n  ls\n  ```\n"
                    "```{toctree}\nhowto/jobs\n```\n")
    monkeypatch.setattr(docs_snippets, "APP_ROOT", tmp_path)
    found = blocks("page.md")
    assert [(b.language, b.kind, b.excerpt, b.directive) for b in found] == [
        ("sh", "not run", None, False), ("python", None, "examples/clinic/clinic/views.py", False),
        ("sh", None, None, False), ("", None, None, True)]
    assert found[0].why == "it needs your broker running" and found[2].code == "ls\n"
