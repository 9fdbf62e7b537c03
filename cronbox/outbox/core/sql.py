"""Statements the backends need written their own way: INSERT that skips existing keys, deleting
the oldest rows in batches, a prefix as a key range."""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session


@dataclass(frozen=True)
class Inserted:
    """What insert_ignore added: how many rows, and the key of the row when it was one."""
    rowcount: int
    inserted_primary_key: tuple | None


def insert_ignore(session: Session | Connection, table, rows) -> Inserted:
    """INSERT that silently skips rows whose primary or unique key exists, on every backend,
    without breaking the caller's transaction (no IntegrityError). `session` may be a Core
    Connection too; `rows` a dict or a list of them.

    MySQL's IGNORE also turns other errors (e.g. a too-long string) into warnings, so
    callers validate lengths and types first; every caller here does. PostgreSQL's ON CONFLICT DO
    NOTHING reports no row count a driver can be trusted with beside SQLAlchemy's implicit RETURNING,
    so there the statement returns the keys it added, and they are counted.
    """
    dialect = session.dialect if isinstance(session, Connection) else session.get_bind().dialect
    if dialect.name == "postgresql":
        # ON CONFLICT DO NOTHING: a row whose key exists is skipped, other errors stay errors (and,
        # PostgreSQL aborting a transaction at its first error, no error may be left to catch).
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        statement = pg_insert(table).on_conflict_do_nothing().returning(*table.primary_key.columns)
        if isinstance(rows, list) and not rows:
            return Inserted(0, None)
        added = list(session.execute(statement, rows).all())  # many rows: SQLAlchemy's insertmanyvalues
        return Inserted(len(added), tuple(added[0]) if len(added) == 1 else None)
    if dialect.name == "sqlite":
        # Imported here: an SQLite engine has loaded it already, a MySQL process never needs it (~5 ms).
        from sqlalchemy.dialects.sqlite import insert

        statement = insert(table).on_conflict_do_nothing()
    else:
        # Imported here as the others: a MySQL engine has loaded it, SQLite and PostgreSQL never need it.
        from sqlalchemy.dialects.mysql import insert as mysql_insert

        statement = mysql_insert(table).prefix_with("IGNORE")
    result = session.execute(statement, rows)
    one = isinstance(rows, dict) and result.rowcount == 1
    return Inserted(result.rowcount, tuple(result.inserted_primary_key) if one else None)


def insert_ignore_id(connection: Session | Connection, table, row: dict) -> int | None:
    """insert_ignore of one row: its new id, or None when a row with its key existed (nothing added)."""
    key = insert_ignore(connection, table, row).inserted_primary_key
    return key[0] if key is not None else None


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
