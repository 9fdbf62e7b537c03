"""Small text helpers for command output."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable

import click

from cronbox.outbox.core import paging
from cronbox.outbox.core.durations import parse_duration
from cronbox.outbox.core.text import clean_text, is_utf8


def age(since: datetime | None, now: datetime) -> str:
    if since is None:
        return "-"
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def table(headers: list[str], rows: list[list]) -> str:
    """Rows as aligned columns. Every cell passes clean_text: what a table shows (event keys and types,
    message ids, errors, names) often came from outside, and a newline or an escape sequence in it
    must neither forge a row nor reach the operator's terminal as it is."""
    cells = [[str(c) for c in headers]] + [[("-" if c is None else _cell(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines)


def _cell(value) -> str:
    text = str(value)
    return clean_text(text, len(text) * 6 + 1)  # never cut: an escape is at most six characters


# The least `outbox prune` and `queue prune` take as --older-than: younger rows are what `outbox status`,
# `queue status`, health and the console show of the last runs, and `--older-than 1s` (or a lost unit)
# would empty them. Audit records have their own floor (AUDIT_RETENTION_FLOOR_DAYS in settings).
PRUNE_FLOOR = timedelta(hours=1)


class Duration(click.ParamType):
    """A click parameter taking 90s / 5m / 48h / 7d (a bare number is refused: see outbox.core.durations);
    value in seconds, at least `floor` when one is given (`why` says the floor and its reason)."""

    name = "duration"

    def __init__(self, floor: float = 0, why: str = ""):
        self.floor, self.why = floor, why

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(value)
            except ValueError as exc:
                shown = value if str(value).isprintable() else repr(value)
                self.fail(f"{shown}: {exc}", param, ctx)
        if seconds < self.floor:
            self.fail(f"must be at least {self.why}", param, ctx)
        return seconds


DURATION = Duration()


class Checked(click.ParamType):
    """Text that `valid` accepts, else a usage error naming it (shown escaped): a name or id typed on
    the command line is checked before it reaches a query, where a stray byte (not UTF-8, so a lone
    surrogate once Python decoded argv) failed inside the database driver instead."""

    def __init__(self, valid: Callable[[str], object], what: str, name: str = "text"):
        self.valid, self.what, self.name = valid, what, name

    def convert(self, value, param, ctx):
        text = str(value)
        if not is_utf8(text) or not self.valid(text):
            self.fail(f"{clean_text(text, 300)!r} is not {self.what}", param, ctx)
        return text


class PageCursor(click.ParamType):
    """A list's page cursor (`--after`), as printed at the end of a full page."""
    name = "cursor"

    def __init__(self, kinds):
        self.kinds = kinds

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            return paging.parse_cursor(value, self.kinds)
        except paging.BadCursor:
            self.fail(f"{value!r} is not a cursor printed by this list", param, ctx)


def never_fits_lines(rows, now: datetime) -> list[str]:
    """The handlers a run found it can never admit (outbox.engine.admission), for `queue status` /
    `outbox status`: said, so no handler starves silently."""
    return [f"never fits: {row.handler} ({row.kind}, {age(row.never_fits_at, now)} ago): {row.never_fits}"
            for row in rows]


def reveal_options(command):
    """`--reveal` and `--reason` of `queue show` and `outbox show`."""
    command = click.option("--reason", default=None, help="Why it is revealed (written to the audit trail).")(command)
    return click.option("--reveal", is_flag=True,
                        help="Show the payload's text (opened if sealed); audited, needs --reason.")(command)


def print_shown(rt, table: str, row_id: int, reveal: bool, reason: str | None) -> None:
    """`queue show` / `outbox show`: the row's payload as a person may see it (storage.payload_reveal)."""
    import getpass

    from cronbox.storage.payload_reveal import show as show_payload

    shown = show_payload(rt, table, row_id, reveal=reveal, actor=f"cli:{getpass.getuser()}", reason=reason)
    click.echo(f"{'job' if table == 'cronbox_jobs' else 'event'} {shown.id}  {shown.name}  {shown.status}")
    click.echo(f"payload: {shown.payload}")
