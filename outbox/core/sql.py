"""Statements both dialects need written their own way: INSERT that skips existing keys, deleting
the oldest rows in batches, a prefix as a key range."""
from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.dialects import mysql as mysql_dialect  # loaded by the models' column types in any case
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session


def insert_ignore(session: Session | Connection, table, rows):
    """INSERT that silently skips rows whose primary or unique key exists, on both dialects,
    without breaking the caller's transaction (no IntegrityError). Returns the result.
    `session` may be a Core Connection too; `rows` a dict or a list of them.

    MySQL's IGNORE also turns other errors (e.g. a too-long string) into warnings, so
    callers validate lengths and types first; every caller here does.
    """
    dialect = session.dialect if isinstance(session, Connection) else session.get_bind().dialect
    if dialect.name == "sqlite":
        # Imported here: an SQLite engine has loaded it already, a MySQL process never needs it (~5 ms).
        from sqlalchemy.dialects.sqlite import insert

        statement = insert(table).on_conflict_do_nothing()
    else:
        statement = mysql_dialect.insert(table).prefix_with("IGNORE")
    return session.execute(statement, rows)


def delete_oldest(session: Session, table, key_columns: list, stamp, cutoff, batch: int) -> int:
    """Delete up to `batch` rows of `table` whose `stamp` is before `cutoff`, oldest first (an index on
    `stamp` serves the read), one DELETE per primary key `key_columns`: for tables keyed by more than
    one column, where `IN` over tuples is not portable. Returns how many."""
    keys = session.execute(select(*key_columns).where(stamp < cutoff).order_by(stamp).limit(batch)).all()
    for key in keys:
        session.execute(delete(table).where(*(column == value for column, value in zip(key_columns, key))))
    return len(keys)


def starts_with(column, prefix: str):
    """`column` begins with `prefix`, byte for byte on every backend, as a key range the index serves.

    Not LIKE: SQLite's LIKE folds ASCII case ('OPS-LOGIN:x' LIKE 'ops-login:%'), and `_`/`%` in a
    prefix are wildcards. Both backends order these columns by bytes (SQLite's BINARY collation,
    VARBINARY on MySQL: `cronbox.outbox.core.models.ExactString`), so [prefix, prefix with its last character
    raised) holds exactly the strings that begin with it."""
    if not prefix:
        raise ValueError("an empty prefix")
    return (column >= prefix) & (column < prefix[:-1] + chr(ord(prefix[-1]) + 1))
