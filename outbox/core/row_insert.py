"""A one-row INSERT of fixed columns, rendered once per dialect and sent on the caller's Connection.

record() and dispatch() add one statement to a web request's transaction. Sent as
`connection.execute(insert(table), row)`, that statement takes SQLAlchemy's whole Core path on
every call: the statement's cache key and compiled-cache lookup, the execution context's
parameter processing, the result's primary-key bookkeeping. That was a third of record()'s
Python (on SQLite, inside an open transaction, ~30 µs of CPU a call before and ~20 after, on the
development machine). The SQL of such an INSERT never changes for a dialect, so it is rendered
once, by SQLAlchemy's own compiler (the dialect's quoting and the driver's parameter style), and
sent with `Connection.exec_driver_sql`.

It is still a statement of the caller's Connection, in its transaction: the Connection's events
fire (cronbox's cleanliness tracking, a host's statement logging or tracing), a driver error is
wrapped as SQLAlchemy's and a lost connection is invalidated as for any other statement. The
columns' bind processors are applied as SQLAlchemy would (SQLite keeps DATETIME as text with six
fraction digits; the sqlite3 module's own adapter would drop them at a whole second). A
Connection with a `schema_translate_map` takes the Core path, which applies it.
"""
from __future__ import annotations

import weakref
from operator import itemgetter

from sqlalchemy import Table, insert
from sqlalchemy.engine import Connection, Dialect


class RowInsert:
    """`RowInsert(table, columns).execute(connection, row)` inserts `row` (a dict with exactly
    those columns) and returns the new row's autoincrement id."""

    def __init__(self, table: Table, columns: tuple[str, ...]):
        self.table = table
        self.columns = tuple(columns)
        self.statement = insert(table)
        # dialect -> (sql, the row's values in the SQL's order for a positional driver or None, bind processors)
        self._rendered: weakref.WeakKeyDictionary[Dialect, tuple] = weakref.WeakKeyDictionary()

    def _render(self, dialect: Dialect) -> tuple:
        compiled = self.statement.compile(dialect=dialect, column_keys=list(self.columns))
        names = set(compiled.bind_names.values())
        if names != set(self.columns) or compiled.escaped_bind_names:
            # A column whose bind name the compiler renamed or escaped: the row's keys would not
            # match the SQL's parameters. Not the case for any cronbox table; refuse loudly.
            raise ValueError(f"{self.table.name}: cannot render a plain INSERT of {self.columns}")
        processors = []
        for name in self.columns:
            processor = self.table.c[name].type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                processors.append((name, processor))
        values = None
        if compiled.positional:
            order = tuple(compiled.positiontup)
            values = itemgetter(*order) if len(order) > 1 else (lambda row: (row[order[0]],))
        return str(compiled), values, tuple(processors)

    def execute(self, connection: Connection, row: dict) -> int:
        if "schema_translate_map" in connection.get_execution_options():
            return connection.execute(self.statement, row).inserted_primary_key[0]
        dialect = connection.dialect
        rendered = self._rendered.get(dialect)
        if rendered is None:
            rendered = self._rendered[dialect] = self._render(dialect)
        sql, values, processors = rendered
        if processors:
            row = dict(row)
            for name, processor in processors:
                row[name] = processor(row[name])
        return connection.exec_driver_sql(sql, row if values is None else values(row)).lastrowid
