"""Text safe to print, log and store: the one list of characters that must never reach an operator's
screen or a log line as they are, and the helpers that escape them.

C0 and C1 controls and DEL cut a line short or move a terminal's cursor; the bidi marks,
embeddings, overrides and isolates make `invoice\u202Efdp.exe` read as `invoiceexe.pdf` (and an
error text read as something else); U+2028/U+2029 break lines. Handler errors escape them
(clean_text below), names and subjects shown to operators replace them
(storage.display), downloads' Content-Disposition drops them (cronbox.web.disposition).

`describe` is how every module turns an exception into "Class: message" for a log line or an error
column, whatever the exception's own methods do.
"""
from __future__ import annotations

import re
from functools import lru_cache

from cronbox.outbox.core.errors import SignalInterrupt

UNSHOWABLE = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"  # a regex character class body
ERROR_MAX = 1000  # the last_error columns
# The short text columns (names, keys, ids, subjects, types): 191 characters, the most a utf8mb4 VARCHAR
# could index within InnoDB's 767-byte key prefix (4 bytes a character: 764). One number for every
# model, check and cut; the migrations keep their literal numbers, frozen history.
NAME_MAX = 191

_LINE_BREAKS = re.compile(r"[\t\n\r\v\f\x1c-\x1e\x85\u2028\u2029]+")
_UNSHOWABLE = re.compile(f"[{UNSHOWABLE}]")  # what is left of them once line breaks are spaces
_UNSHOWABLE_BUT_LINES = re.compile(f"(?![\\t\\n\\r])[{UNSHOWABLE}]")  # a traceback keeps its lines


def is_utf8(text: str) -> bool:
    """Whether `text` can be stored and sent as UTF-8. A lone surrogate (what os.fsdecode and
    surrogateescape leave of bytes that were not UTF-8) cannot: each database driver refuses it with
    an error of its own, deep in a write. Text cronbox stores is checked with this first."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def ascii_number(text: str | None, max_digits: int) -> int | None:
    """The number `text` writes in ASCII digits alone (0-9, 1 to `max_digits` of them), else None.

    For what a client sends (a header, a form field, a query or path parameter): `int()` also takes
    other scripts' digits ("١٢"), a sign, underscores and spaces around, and `str.isdigit()` says yes
    to "²", which `int()` then refuses (a 500 where a 400 belongs). A run of digits longer than any
    number of ours is refused too, before `int()` (past 4300 digits it raises) or a float would see it."""
    if text and len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def clean_text(text: str, limit: int = ERROR_MAX, *, one_line: bool = True) -> str:
    """`text` made safe to print, log and store: lone surrogates, control and bidi characters escaped,
    line breaks turned into spaces (unless `one_line` is False), at most `limit` characters."""
    text = str.__str__(text)[:limit]  # an exact str: a subclass could override what follows
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if one_line:
        text = _LINE_BREAKS.sub(" ", text)
    text = (_UNSHOWABLE if one_line else _UNSHOWABLE_BUT_LINES).sub(_escape, text)
    return text[:limit].strip()


@lru_cache(maxsize=256)
def shown_name(name: str) -> str:
    """A name from a row (an event type, a job's handler) as a log line shows it: clean_text'd, once per
    name (a run logs a line per item, and has few names)."""
    return clean_text(name, NAME_MAX)


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def ascii_text(text: str) -> str:
    """For a column or terminal that takes nothing but ASCII."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


def describe(exc: BaseException, limit: int = ERROR_MAX) -> str:
    """"Class: message" for logs and error columns, whatever the exception does: a __str__ that
    raises or returns a monster, odd args, unencodable text."""
    name = _class_name(exc)
    try:
        text = str(exc)
    except SignalInterrupt:
        raise
    except BaseException as err:  # a broken __str__ (or an arg whose __str__/__repr__ raises)
        text = f"<str() raised {_class_name(err)}>"
    text = clean_text(text, limit)
    return f"{name}: {text}"[:limit] if text else name


def _class_name(exc: BaseException) -> str:
    try:
        return clean_text(type(exc).__name__, NAME_MAX) or "Exception"
    except Exception:  # a metaclass with a __name__ that is not a string
        return "Exception"
