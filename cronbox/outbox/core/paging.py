"""Keyset pagination for long lists, the console's and the CLI's (100k audit rows must not mean OFFSET 99,950).

A page is the next `size` rows strictly after a cursor in the list's order,
newest first. The order is one or two columns that end with the primary key
(id, or time then id), and each list has an index in that order, so a page
costs an index range read whatever its depth. The cursor is the last row's
key values in the URL (`?after=...`); a cursor that does not parse is the
caller's 400, never a 500.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import and_, or_
from sqlalchemy.orm import Session

from cronbox.outbox.core.text import ascii_number

PAGE_SIZE = 50
MAX_ID = 2**63 - 1  # BIGINT; a larger number is nobody's id (and SQLite cannot even bind it)
ID_DIGITS = len(str(MAX_ID))
_SEPARATOR = "~"


class BadCursor(ValueError):
    pass


@dataclass(frozen=True)
class Page:
    rows: list[Any]
    after: str | None  # cursor of the next page; None on the last page


def parse_cursor(text: str | None, kinds: Sequence[type]) -> tuple | None:
    """`kinds`: the key's value types in order (datetime, int or str)."""
    if not text:
        return None
    parts = text.split(_SEPARATOR)
    if len(parts) != len(kinds) or len(text) > 200 or not text.isascii():  # a cursor we made is ASCII
        raise BadCursor("the page cursor is malformed")
    values = []
    try:
        for part, kind in zip(parts, kinds):
            value = datetime.fromisoformat(part) if kind is datetime else _number(part) if kind is int else kind(part)
            if kind is int and not 0 <= value <= MAX_ID:
                raise ValueError("out of range")
            if kind is datetime and value.tzinfo is not None:
                raise ValueError("stored times are naive UTC")
            values.append(value)
    except (ValueError, TypeError) as exc:
        raise BadCursor("the page cursor is malformed") from exc
    return tuple(values)


def _number(text: str) -> int:
    number = ascii_number(text, ID_DIGITS)
    if number is None:
        raise ValueError("not a number")
    return number


def _format(values: Sequence[Any]) -> str:
    return _SEPARATOR.join(v.isoformat() if isinstance(v, datetime) else str(v) for v in values)


def _after(columns: Sequence, cursor: tuple):
    """Rows after `cursor` in descending (a, b) order: a <= x AND (a < x OR (a = x AND b < y)).

    The redundant `a <= x` is what turns the OR into an index range on both
    backends: without it MariaDB and SQLite seek on the status alone and read
    every row before the cursor (25,000 rows for a page 500 deep)."""
    if len(columns) == 1:
        return columns[0] < cursor[0]
    first, second = columns
    return and_(first <= cursor[0], or_(first < cursor[0], and_(first == cursor[0], second < cursor[1])))


def page(session: Session, query, columns: Sequence, cursor: tuple | None, *, size: int = PAGE_SIZE,
         index: str | None = None) -> Page:
    """Run `query` (a select() whose rows carry `columns` by their keys) newest first, one page of it.

    `index`: the index in this order, forced on MySQL/MariaDB for pages after the first. When the
    status filtered on is half the table, InnoDB's capped range estimate makes the optimizer prefer
    a lookup on the status alone, which reads every row before the cursor."""
    if cursor is not None:
        query = query.where(_after(columns, cursor))
        if index is not None:
            for dialect in ("mysql", "mariadb"):
                query = query.with_hint(columns[0].table, f"FORCE INDEX ({index})", dialect_name=dialect)
    rows = list(session.execute(query.order_by(*[c.desc() for c in columns]).limit(size + 1)).all())
    more = len(rows) > size
    rows = rows[:size]
    after = _format([getattr(rows[-1], c.key) for c in columns]) if more and rows else None
    return Page(rows, after)
