"""Errors of sealed storage, under cronbox's one root (outbox.core.errors.CronboxError).

The command line prints any of them as one line and exits 1; the web layer
maps them to status codes (never a 500 for a client's mistake).
"""
from __future__ import annotations

from cronbox.outbox.core.errors import CronboxError


class StorageError(CronboxError):
    """Root of sealed-storage errors."""


class IntegrityError(StorageError):
    """A sealed file, its header, wrapped key or metadata failed authentication or is malformed.

    Never served: a reader stops at the first failing chunk. `chunk` is the index
    of the chunk that failed, when one did.
    """

    def __init__(self, message: str, *, chunk: int | None = None):
        self.chunk = chunk
        super().__init__(message if chunk is None else f"{message} (chunk {chunk})")


class KeyFolderError(StorageError):
    """The key folder is unsafe (readable by others, inside the web root) or unreadable."""


class UnknownKey(StorageError):
    """A row names a master key id that is not in the key folder."""


class NotFound(StorageError):
    """An id given by the caller (file, grant) does not exist."""


class GrantInvalid(StorageError):
    """A grant cannot be used (revoked, expired, exhausted)."""


class BaseUrlMissing(StorageError):
    """An absolute link was asked for, but CRONBOX_BASE_URL (the site's own address) is not set."""

    def __init__(self):
        super().__init__("an absolute link needs CRONBOX_BASE_URL, the site's address (e.g. https://clinic.example); "
                         "set it in .env")


class TooLarge(StorageError):
    """A stream was longer than the allowed upload size."""

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"the file is larger than the limit of {limit} bytes (CRONBOX_UPLOAD_MAX)")


class NoAppContext(StorageError):
    """A module-level call (`storage.put()`, ...) outside an app context, in a process with a host app.

    Which keys to seal under is the app's setting (`<instance>/cronbox/keys`): a store guessed from the
    environment and the working directory would write a master key nobody backs up, beside a database
    nobody reads.
    """

    def __init__(self):
        super().__init__("sealed storage used outside an app context in a process with a host app: call it inside "
                         "`with app.app_context():` (a request, a cronbox handler and every cron command already are), "
                         "or use `cronbox.storage` there")
