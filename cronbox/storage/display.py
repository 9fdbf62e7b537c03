"""Stored text made safe to show to an operator: no control or bidi-formatting characters.

Names, subjects and details in the console and the command line's output come
from whoever uploaded a file or called the API. A right-to-left override shows
`invoice\u202Efdp.exe` as `invoiceexe.pdf`; NUL and other C0/C1 controls cut a
line short or move a terminal's cursor. The one list of these characters is
outbox.core.text.UNSHOWABLE: the download's Content-Disposition (cronbox.web.disposition)
removes the same ones, and owners and subjects containing them are refused when written.
"""
from __future__ import annotations

import re

from cronbox.outbox.core.text import UNSHOWABLE

_UNSHOWABLE = re.compile(f"[{UNSHOWABLE}]")


def has_unshowable(text: str) -> bool:
    return _UNSHOWABLE.search(text) is not None


def shown(text: str | None) -> str | None:
    """`text` with each unshowable character replaced by `_` (as in a downloaded file's name)."""
    return None if text is None else _UNSHOWABLE.sub("_", text)
