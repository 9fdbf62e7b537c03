"""What every cronbox table shares: the declarative base, its naming convention, column types.

Every table is prefixed `cronbox_` because the host app shares the database. Times are naive UTC
(see clock.py). Each family keeps its own tables beside its code (`outbox/events/models.py`,
`outbox/queue/models.py`, ...); schema changes go through migrations/ only, and
tests/db/test_migrations.py checks that the models and the migrations agree.
"""
from __future__ import annotations

from sqlalchemy import BigInteger, DateTime, Integer, MetaData, Text
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Microsecond precision on MySQL (plain DATETIME truncates to seconds, which would
# make "oldest due age" and latency numbers meaningless).
UtcDateTime = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
# BIGINT ids on MySQL; SQLite only auto-increments a column declared INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
