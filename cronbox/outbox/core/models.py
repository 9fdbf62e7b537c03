"""What every cronbox table shares: the declarative base, its naming convention, column types.

Every table is prefixed `cronbox_` because the host app shares the database. Times are naive UTC
(see clock.py). Each family keeps its own tables beside its code (`outbox/events/models.py`,
`outbox/queue/models.py`, ...); schema changes go through migrations/ only, and
tests/db/test_migrations.py checks that the models and the migrations agree.
"""
from __future__ import annotations

from sqlalchemy import BigInteger, DateTime, Integer, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

MYSQL_DIALECTS = ("mysql", "mariadb")


# The MySQL column types below are chosen when a MySQL engine compiles them, not named with
# `with_variant` at import: naming them imports `sqlalchemy.dialects.mysql`, whose package loads
# every MySQL driver's dialect module (~20 modules, ~2 MiB and ~20 ms), which a cron process on
# SQLite or PostgreSQL never uses. A MySQL engine has imported them already.
class MicrosecondDateTime(TypeDecorator):
    """DATETIME with microseconds on MySQL (plain DATETIME truncates to seconds, which would make
    "oldest due age" and latency numbers meaningless); the backend's DateTime elsewhere. Naive UTC."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name in MYSQL_DIALECTS:
            from sqlalchemy.dialects.mysql import DATETIME

            return dialect.type_descriptor(DATETIME(fsp=6))
        return DateTime()  # as declared (see LongTextType)


class LongTextType(TypeDecorator):
    """LONGTEXT on MySQL (TEXT holds 64 KiB there), the backend's TEXT elsewhere."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name in MYSQL_DIALECTS:
            from sqlalchemy.dialects.mysql import LONGTEXT

            return dialect.type_descriptor(LONGTEXT())
        # The type as declared, not the dialect's adaptation of it: psycopg's dialect adapts Text to its
        # String, whose DDL (and Alembic's comparison with the migrations) would say VARCHAR, not TEXT.
        return Text()


UtcDateTime = MicrosecondDateTime()
LongText = LongTextType()
# BIGINT ids on MySQL; SQLite only auto-increments a column declared INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")


class ExactString(TypeDecorator):
    """A name or id cronbox compares as an identity (message ids, consumers, keys, claim tokens, job
    and queue names, file and grant ids, subjects): equal only when the bytes are, on every backend.

    MySQL/MariaDB compare VARCHAR by the column's collation: the default ones fold case and accents
    (`utf8mb4_general_ci`: 'msg-a' = 'MSG-A' = 'msg-á'), and even the `_bin` ones pad ('a' = 'a ').
    A NO PAD binary collation exists on MariaDB 10.2+ (`utf8mb4_nopad_bin`) and MySQL 8.0.17+
    (`utf8mb4_0900_bin`), not on MySQL 5.7 or early 8.0, which we support; VARBINARY compares bytes
    without padding on all of them, so that is the column there (migration 0010), and the text is
    stored as its UTF-8 bytes. `length` stays the length in characters the column had: the
    VARBINARY holds 4 bytes a character, so whatever fitted before still fits (the callers' own
    length checks count characters, as before), and the widest index, the deliveries' (consumer,
    key, status, event_id), is 1,600 bytes, under InnoDB's 3072-byte limit. SQLite compares TEXT
    bytewise already (BINARY collation), so the column stays VARCHAR there. PostgreSQL's VARCHAR
    does not pad, and its deterministic collations call strings equal only when their bytes are, but
    they order by language rules: the column is `COLLATE "C"` there, so order is by bytes too (key
    ranges, `outbox.core.sql.starts_with`). Python sees `str` either way; plain SQL on MySQL reads bytes.
    """

    impl = String
    cache_ok = True

    def __init__(self, length: int):
        super().__init__(length)

    @property
    def python_type(self):
        return str

    def load_dialect_impl(self, dialect):
        if dialect.name in MYSQL_DIALECTS:
            from sqlalchemy.dialects.mysql import VARBINARY

            return dialect.type_descriptor(VARBINARY(4 * self.impl.length))
        if dialect.name == "postgresql":
            return dialect.type_descriptor(String(self.impl.length, collation="C"))
        return dialect.type_descriptor(String(self.impl.length))

    def process_bind_param(self, value, dialect):
        if isinstance(value, str) and dialect.name in MYSQL_DIALECTS:
            return value.encode("utf-8")
        return value

    def process_result_value(self, value, dialect):
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode("utf-8")
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
