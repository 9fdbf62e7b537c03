"""What record() (outbox.events.record) and dispatch() (outbox.queue.jobs) share when they add a row to
the caller's transaction: the checks of their arguments, that transaction's connection, a trace id.

One check per kind of argument, so the same fault gets the same refusal from either call: a
`PayloadError` (a `CronboxError` and a `TypeError`) naming the argument, raised before anything is
written or the caller's session is touched.
"""
from __future__ import annotations

import os
from datetime import timedelta

from sqlalchemy.engine import Connection

from cronbox.outbox.core.errors import PayloadError
from cronbox.outbox.core.session_types import Transactional
from cronbox.outbox.core.text import is_utf8

MAX_DELAY = 100 * 366 * 86400  # seconds: a century; far enough for any "later", near enough to stay a date


def delay_seconds(delay: float | timedelta) -> float:
    """`delay` (a number of seconds, or a timedelta) as seconds, from 0 to MAX_DELAY. A bool, NaN,
    infinity, a negative or a larger number, or anything else is refused."""
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_DELAY:
        raise PayloadError(f"delay must be a number of seconds from 0 to {MAX_DELAY} (a century), not {delay!r}")
    return seconds


def check_text(value: object, what: str, *, limit: int | None, optional: bool = False) -> None:
    """A name or key stored as given (an event's type and key, a job's unique key): a non-empty str
    of at most `limit` characters (None: any, the caller makes it fit), or None when `optional`;
    no NUL (PostgreSQL stores none in text: no backend does) and no lone surrogate (what
    os.fsdecode leaves of bytes that were not UTF-8: every driver refuses it, deep in a write)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value or (limit is not None and len(value) > limit):
        raise PayloadError(f"{what} must be {'None or ' if optional else ''}a non-empty string"
                           + (f" of at most {limit} characters" if limit is not None else ""))
    if "\x00" in value:
        raise PayloadError(f"{what} must not contain NUL characters")
    if not is_utf8(value):
        raise PayloadError(f"{what} must be UTF-8 text (no lone surrogates)")


def new_trace_id() -> str:
    """The id a row's log lines share, from its insert to its last attempt."""
    return os.urandom(8).hex()


def connection_of(session: Transactional, model) -> Connection:
    """The connection of the caller's transaction: a Connection as it is, a Session's (or a
    Flask-SQLAlchemy scoped session's) for `model`'s table (a host's binds decide, as they would
    for a flush), begun if it was not. Never a flush: the caller's pending objects stay as they are."""
    if isinstance(session, Connection):
        return session
    return session.connection(bind_arguments={"mapper": model})
