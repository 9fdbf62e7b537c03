"""Content-Disposition and Content-Type for downloads, safe whatever name and type were uploaded.

The original name comes from whoever uploaded the file and is replayed into a
response header and then into the user's file system, so it is cleaned for
both: no header injection (CR, LF, NUL, quotes, `;`), no path (`../../x`,
`C:\\x`), no control or bidi-formatting characters (storage.display's list:
`invoice\u202Efdp.exe` shows as `invoiceexe.pdf`), no Windows device names, a
bounded length that keeps the extension. The result goes out twice (RFC 6266): an ASCII
`filename="..."` for old clients and `filename*=UTF-8''...` (RFC 8187) with
the full Unicode name.
"""
from __future__ import annotations

import re
import unicodedata
from urllib.parse import quote

from cronbox.outbox.core.text import UNSHOWABLE

MAX_NAME = 150
FALLBACK = "download"
_UNSAFE = re.compile(f'[{UNSHOWABLE}"*:<>?|;\\\\/]')
_ASCII_UNSAFE = re.compile(r"[^A-Za-z0-9._()+,=@!#$&~^ -]")
_RESERVED = re.compile(r"^(con|prn|aux|nul|com\d|lpt\d)(\..*)?$", re.IGNORECASE)
_ATTR_CHAR = "!#$&+-.^_`|~"  # RFC 8187 attr-char punctuation, left unescaped
_TOKEN_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}\Z")


def clean_name(name: str | None) -> str:
    name = unicodedata.normalize("NFC", name or "")
    name = re.split(r"[/\\]", name)[-1]  # path parts: keep the last component only
    name = _UNSAFE.sub("_", name)
    name = re.sub(r"\s+", " ", name).strip(" .")
    if _RESERVED.match(name):
        name = "_" + name
    if len(name) > MAX_NAME:
        stem, dot, extension = name.rpartition(".")
        if dot and 0 < len(extension) <= 16:
            name = stem[: MAX_NAME - len(extension) - 1].rstrip(" .") + "." + extension
        else:
            name = name[:MAX_NAME].rstrip(" .")
    return name or FALLBACK


def _fold(text: str) -> str:
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r" +", " ", _ASCII_UNSAFE.sub("_", folded)).strip(" .")


def ascii_name(name: str) -> str:
    """The ASCII fallback: accents folded, the rest replaced; a name with no ASCII left keeps its extension."""
    stem, dot, extension = name.rpartition(".")
    if not dot:
        stem, extension = name, ""
    stem, extension = _fold(stem), _fold(extension)
    stem = stem if stem.strip("_") else FALLBACK
    return f"{stem}.{extension}" if extension else stem


def content_disposition(name: str | None) -> str:
    cleaned = clean_name(name)
    return f"attachment; filename=\"{ascii_name(cleaned)}\"; filename*=UTF-8''{quote(cleaned, safe=_ATTR_CHAR)}"


def content_type(declared: str | None) -> str:
    """The uploaded type if it is a plain `type/subtype` token pair, else application/octet-stream."""
    base = (declared or "").split(";", 1)[0].strip()
    return base.lower() if _TOKEN_TYPE.match(base) else "application/octet-stream"
