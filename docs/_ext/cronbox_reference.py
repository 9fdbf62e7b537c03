"""Reference tables generated from cronbox's own code (settings, database tables, metrics), and the
check that every public name has a docstring. A Sphinx extension of this site only."""
from __future__ import annotations


def setup(app):
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
