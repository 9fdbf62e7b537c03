"""Sphinx configuration: the docs site, built offline with warnings as errors.

    sphinx-build -W --keep-going -b html docs docs/_build/html

Pages are Markdown (MyST), as the Pallets projects and procrastinate write theirs; the reference is
generated from the code (autodoc, sphinx-click, and docs/_ext/cronbox_reference.py for the settings,
tables and metrics), so it cannot drift from it. Nothing here reaches the network: no intersphinx.
"""
from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]  # cronbox from this checkout; our extension

project = "cronbox"
author = "the cronbox developers"
copyright = "cronbox developers"  # noqa: A001 (Sphinx's name)
release = version = __import__("tomllib").loads((DOCS.parent / "pyproject.toml").read_text())["project"]["version"]

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "cronbox_reference",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 4  # [text](page.md#a-heading) links work as on GitHub

default_role = "code"  # `name` in a docstring, as in Markdown
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": False}

html_theme = "furo"
html_title = f"cronbox {release}"
html_static_path = ["_static"]
html_last_updated_fmt = None
