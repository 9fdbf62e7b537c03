"""Every table a command prints (`outbox dead`, `queue failed`, `amqp dead`, ...) shows its cells
through clean_text: stored strings came from outside (event keys and types, errors, message ids)."""
from __future__ import annotations

import re

import pytest

from cronbox.cron.format import table
from cronbox.outbox.core.text import UNSHOWABLE

NASTY = ["\r", "\n", "\r\nid  forged row", "\x1b[2J", "\x1b]0;t\x07", "\x00", "\x7f", "\x85", "\x9b", "\u2028",
         "\u2029", "\u202e", "\u2066", "\u061c", "\udcff"]


@pytest.mark.parametrize("nasty", NASTY)
@pytest.mark.parametrize("column", range(3))
def test_a_cell_never_adds_a_row_nor_a_control_character(nasty, column):
    row = ["a", "b", "c"]
    row[column] = f"x{nasty}y"
    text = table(["id", "key", "error"], [row, ["1", "2", "3"]])
    assert len(text.splitlines()) == 3
    assert not re.search(f"(?![\\n])[{UNSHOWABLE}]", text)
    assert "x" in text.splitlines()[1] and "y" in text.splitlines()[1]  # escaped, not dropped


def test_plain_cells_are_shown_as_they_are():
    assert table(["id", "key"], [[1, "patient:3"], [None, "a b"]]).splitlines() == [
        "id        key", "1   patient:3", "-         a b"]
