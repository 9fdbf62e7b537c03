"""The SQLite database on disk, kept private: the file holds job payloads (phone numbers, SMS texts)
and audit subjects in clear, and on a shared host another account may read any file that is
group/other-readable in a folder it can enter.

- A database file cronbox creates is created 0600 (before SQLite would make it 0644 under the usual
  umask); SQLite gives its -wal, -shm and -journal files the database file's mode.
- `migrate`, and the migration a SQLite database gets on first use (outbox.core.migrate.ensure_schema,
  e.g. in a host app's web process nobody ran `migrate` for), narrow an existing database file (and its
  side files) to 0600 when this user owns it (a host app's file made by Flask-SQLAlchemy is 0644), and
  say so (`make_private`); a file of another owner is left as it is, for its owner.
- Health fails while the file, a side file or its folder is open to the group or others.

The umask is never touched (it is process-wide, and a web process has other threads creating files),
and a database file is only ever chmod-ed by path, never opened: closing any descriptor of a file
drops every POSIX lock this process holds on it, including those of SQLite connections already open
on the database (a web app's pool), which then lets another process read around their locks.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from sqlalchemy.engine import make_url

SIDE_SUFFIXES = ("-wal", "-shm", "-journal")
PRIVATE = 0o077  # group and other bits: any of them open the file to another account


def database_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for other databases, in-memory ones and `file:` URIs."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return None
    path = parsed.database
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return Path(path).absolute()


def files_of(database: Path) -> list[Path]:
    """The database file and those of its side files that exist now."""
    candidates = [database, *(database.with_name(database.name + suffix) for suffix in SIDE_SUFFIXES)]
    return [path for path in candidates if path.exists()]


def create_private(database: Path) -> None:
    """Create the database file 0600 if it does not exist yet (O_EXCL: an existing one is never opened).
    A path SQLite cannot use is left to SQLite, which says what is wrong when it connects."""
    try:
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        pass


def open_to_others(database: Path) -> list[tuple[Path, int]]:
    """(path, mode) of the database's folder and files that the group or others may use."""
    found = []
    for path in [database.parent, *files_of(database)]:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except OSError:
            continue
        if mode & PRIVATE:
            found.append((path, mode))
    return found


def narrow(database: Path) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]]]:
    """chmod 0600 the database file and its side files open to others and owned by this user.
    Returns (narrowed, left): (path, mode before) of each file; `left` are other owners' files."""
    narrowed, left = [], []
    uid = os.getuid()
    for path in files_of(database):
        try:
            info = path.stat()
            mode = stat.S_IMODE(info.st_mode)
            if not mode & PRIVATE:
                continue
            if info.st_uid != uid:
                left.append((path, mode))
                continue
            path.chmod(0o600)
            narrowed.append((path, mode))
        except FileNotFoundError:  # a -journal or -wal gone meanwhile
            continue
    return narrowed, left


def make_private(url: str) -> tuple[list[str], list[str]]:
    """Narrow the SQLite database of `url` (`narrow`) and say what happened: one line per file narrowed,
    and one warning per file (another owner's) or folder still open to others. Nothing for other databases."""
    database = database_path(url)
    if database is None:
        return [], []
    narrowed, left = narrow(database)
    done = [f"{path} was mode {mode:#o}, open to other users: narrowed to 0600" for path, mode in narrowed]
    warnings = [f"{path} is mode {mode:#o}, open to other users, and not yours: its owner should chmod 600 it"
                for path, mode in left]
    folder = database.parent
    if folder.stat().st_mode & PRIVATE:
        warnings.append(f"{folder} (the database's folder) is open to other users: chmod 700 it")
    return done, warnings
