"""The database server behind an engine: which kind, which version, what it supports, its name."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine


def is_mysql(engine_or_bind) -> bool:
    return engine_or_bind.dialect.name in ("mysql", "mariadb")


def server_version(engine: Engine) -> str:
    """The server's version (10.11.19-MariaDB, 8.0.36, sqlite 3.45.1). MySQL: as the dialect read it
    on the engine's first connection (SQLAlchemy asks every new engine's server), not one more query
    per run (the claim path's choice asked SELECT VERSION() in every tick)."""
    if is_mysql(engine):
        dialect = engine.dialect
        if dialect.server_version_info is None:  # no connection made yet: the first one reads it
            with engine.connect():
                pass
        version = ".".join(str(part) for part in dialect.server_version_info if isinstance(part, int))
        return f"{version}-MariaDB" if dialect.is_mariadb else version
    with engine.connect() as connection:
        return "sqlite " + connection.execute(text("SELECT sqlite_version()")).scalar_one()


def supports_skip_locked(version: str) -> bool:
    """FOR UPDATE SKIP LOCKED: MySQL >= 8.0.1, MariaDB >= 10.6 (SQLAlchemy renders it regardless)."""
    head = version.split("-")[0]
    try:
        parts = tuple(int(p) for p in head.split(".")[:3])
    except ValueError:
        return False
    if "mariadb" in version.lower():
        return parts >= (10, 6)
    return parts >= (8, 0, 1)


def database_name(engine: Engine) -> str:
    if is_mysql(engine):
        return engine.url.database or ""
    return engine.url.database or "memory"
