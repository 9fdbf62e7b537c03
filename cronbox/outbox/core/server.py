"""The database server behind an engine: which kind, which version, what it supports, its name.

Three backends: SQLite (the embedded default), MySQL/MariaDB and PostgreSQL. `is_server` is what
most code asks (a server with its own connections, locks and SKIP LOCKED, against an SQLite file);
`is_mysql` and `is_postgresql` only where the two servers' SQL differs.
"""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine


def is_mysql(engine_or_bind) -> bool:
    return engine_or_bind.dialect.name in ("mysql", "mariadb")


def is_postgresql(engine_or_bind) -> bool:
    return engine_or_bind.dialect.name == "postgresql"


def is_server(engine_or_bind) -> bool:
    """A database server (MySQL/MariaDB or PostgreSQL), not an SQLite file."""
    return engine_or_bind.dialect.name != "sqlite"


def transaction_aborted(connection) -> bool:
    """A PostgreSQL transaction on this SQLAlchemy Connection that an error aborted: its COMMIT would
    roll back without a word. psycopg's public ConnectionInfo says so without a round trip. Other
    servers keep a transaction usable after a failed statement."""
    if not is_postgresql(connection):
        return False
    from psycopg.pq import TransactionStatus  # a PostgreSQL connection has loaded psycopg already

    return connection.connection.dbapi_connection.info.transaction_status == TransactionStatus.INERROR


def server_version(engine: Engine) -> str:
    """The server's version (10.11.19-MariaDB, 8.0.36, sqlite 3.45.1). MySQL: as the dialect read it
    on the engine's first connection (SQLAlchemy asks every new engine's server), not one more query
    per run (the claim path's choice asked SELECT VERSION() in every tick)."""
    if is_server(engine):
        dialect = engine.dialect
        if dialect.server_version_info is None:  # no connection made yet: the first one reads it
            with engine.connect():
                pass
        version = ".".join(str(part) for part in dialect.server_version_info if isinstance(part, int))
        if is_postgresql(engine):
            return f"{version}-PostgreSQL"
        return f"{version}-MariaDB" if dialect.is_mariadb else version
    with engine.connect() as connection:
        return "sqlite " + connection.execute(text("SELECT sqlite_version()")).scalar_one()


def supports_skip_locked(version: str) -> bool:
    """FOR UPDATE SKIP LOCKED: MySQL >= 8.0.1, MariaDB >= 10.6, PostgreSQL >= 9.5 (SQLAlchemy renders
    it regardless)."""
    head = version.split("-")[0]
    try:
        parts = tuple(int(p) for p in head.split(".")[:3])
    except ValueError:
        return False
    if "postgresql" in version.lower():
        return parts >= (9, 5)
    if "mariadb" in version.lower():
        return parts >= (10, 6)
    return parts >= (8, 0, 1)


def database_name(engine: Engine) -> str:
    if is_server(engine):
        return engine.url.database or ""
    return engine.url.database or "memory"
