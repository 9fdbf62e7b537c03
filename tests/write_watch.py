"""Who writes what, for tests that must prove nothing reached the disk (a plaintext spool file of an upload).

One audit hook for the whole process (hooks cannot be removed), recording only while the `writes` fixture
runs: every path Python opens for writing (open(), os.open(), tempfile, O_TMPFILE files under their folder).
"""
from __future__ import annotations

import os
import sys

import pytest

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_opened_for_writing: list[str] | None = None  # None: the hook records nothing


def _record_writes(event: str, args: tuple) -> None:
    if event != "open" or _opened_for_writing is None:
        return
    path, mode, flags = args
    if isinstance(path, int):  # os.fdopen of a descriptor whose os.open was already seen
        return
    writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS)
    if writing:
        _opened_for_writing.append(os.fsdecode(path))


sys.addaudithook(_record_writes)


@pytest.fixture
def writes():
    """Paths opened for writing (by Python: open(), os.open(), tempfile) while the test runs."""
    global _opened_for_writing
    _opened_for_writing = []
    try:
        yield _opened_for_writing
    finally:
        _opened_for_writing = None
