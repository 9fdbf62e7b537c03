"""Engines and transactions fit for a shared host.

- MySQL/MariaDB: every session in UTC (`time_zone='+00:00'`) and at READ COMMITTED:
  under REPEATABLE READ a claim's next-key locks would block the app's record()
  and wait on its open transactions. A ping at checkout of a connection that sat idle
  (see _ping_when_idle) plus a pool_recycle below the host's (often 20-60 s)
  wait_timeout, because idle connections are killed.
  Cron processes get a pool of exactly one connection, no overflow: the account
  may have max_user_connections as low as 3.
- SQLite (the embedded default): WAL, busy_timeout, and BEGIN IMMEDIATE for
  every transaction, so a reader never has to upgrade to a writer halfway (that
  fails at once with "database is locked" instead of waiting).
"""
from __future__ import annotations

import logging
import random
import sys
import time
from datetime import datetime
from typing import Callable, TypeVar

from sqlalchemy import create_engine, delete, event, select, text
from sqlalchemy.dialects import mysql as mysql_dialect  # loaded by the models' column types in any case
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from outbox.core import sqlite_files
from outbox.core.lock_wait import SQLITE_BUSY_MS, restore_on_return
from outbox.core.settings import Settings

log = logging.getLogger("cronbox")
T = TypeVar("T")

# MySQL error codes.
DEADLOCK, LOCK_WAIT_TIMEOUT = 1213, 1205
LOCK_CONFLICTS = {DEADLOCK, LOCK_WAIT_TIMEOUT}
CONNECTION_LOST = {2006, 2013, 2003, 2002, 1226, 1927, 1053, 4031}  # gone away, lost, can't connect, too many user connections, killed, shutdown, idle disconnect
SQLITE_BUSY = ("database is locked", "database table is locked")
CRON_WAIT_TIMEOUT = 3600  # seconds; see _session_setup


def make_engine(settings: Settings, *, role: str = "cron", url: str | None = None) -> Engine:
    """role: "cron" (one pooled connection), "web" (small pool) or "lock" (no pool: one dedicated connection)."""
    url = url or settings.database_url
    if url.startswith("sqlite"):
        return _sqlite_engine(settings, url, role)
    return _mysql_engine(settings, url, role)


def _pool_args(role: str) -> dict:
    if role == "lock":
        return {"poolclass": NullPool}
    # Reset on return is done by _reset_on_return below.
    if role == "cron":
        return {"pool_size": 1, "max_overflow": 0, "pool_timeout": 30, "pool_reset_on_return": None}
    return {"pool_size": 2, "max_overflow": 2, "pool_timeout": 10, "pool_reset_on_return": None}


def _reset_on_return(dbapi_connection, record, reset_state) -> None:
    """Roll back a returned connection only if a statement ran since its last COMMIT/ROLLBACK.

    The pool's default ROLLBACK on every return costs a round trip after each
    committed transaction (SQLAlchemy cannot tell a committed connection from a
    dirty one); a web request recording one event would pay 4 round trips, not 3.
    """
    if reset_state.terminate_only or record.info.get(_CLEAN):
        return
    dbapi_connection.rollback()
    record.info[_CLEAN] = True


_CLEAN = "cronbox_clean"


def _track_cleanliness(engine: Engine) -> None:
    event.listen(engine, "reset", _reset_on_return)

    def clean(connection, *args):
        if not connection.invalidated:  # an invalidated connection is discarded, never reused
            connection.info[_CLEAN] = True

    def dirty(connection, *args):
        if not connection.invalidated:
            connection.info[_CLEAN] = False

    event.listen(engine, "commit", clean)
    event.listen(engine, "rollback", clean)
    event.listen(engine, "before_cursor_execute", dirty)


def _plain_savepoints(engine: Engine) -> None:
    """SAVEPOINT, ROLLBACK TO SAVEPOINT and RELEASE SAVEPOINT sent as plain SQL text on this engine.

    SQLAlchemy compiles its savepoint clauses afresh on every call (they opt out of its compiled
    cache, inherit_cache=False): ~40-90 µs of Python each on this machine. Every handler attempt
    that writes through ctx.session opens one, and a grouped item pays little else besides its own
    statements (outbox.engine.processor.Group). The statements still go through the Connection
    (its events fire: the group's deadlock watch, the cleanliness tracking above); the names are
    SQLAlchemy's own (sa_savepoint_N), quoted by the dialect all the same. Set on this engine's
    dialect instance only (create_engine makes one per engine): any other engine in the process,
    a host app's, keeps SQLAlchemy's.
    """
    dialect = engine.dialect
    quote = dialect.identifier_preparer.quote

    def do_savepoint(connection, name):
        connection.exec_driver_sql(f"SAVEPOINT {quote(name)}")

    def do_rollback_to_savepoint(connection, name):
        connection.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {quote(name)}")

    def do_release_savepoint(connection, name):
        connection.exec_driver_sql(f"RELEASE SAVEPOINT {quote(name)}")

    dialect.do_savepoint = do_savepoint
    dialect.do_rollback_to_savepoint = do_rollback_to_savepoint
    dialect.do_release_savepoint = do_release_savepoint


PING_WHEN_IDLE = 0.5  # seconds a pooled connection may sit unused and still be handed out unpinged
_RETURNED_AT = "cronbox_returned_at"


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout only if it sat in the pool PING_WHEN_IDLE or longer.

    SQLAlchemy's pool_pre_ping costs a round trip on every checkout: a web request recording one
    event would pay 4 round trips, not 3, and back-to-back transactions pay it for a connection
    used a millisecond ago. What a ping guards against is a connection the server closed while it
    sat idle (wait_timeout, at least 1 s; a host's idle killer): one returned less than half a
    second ago cannot have been. A server restart or KILL inside that half second still surfaces,
    as the statement's disconnect error: the pool then drops every connection it holds, and the
    cron runs' transactions retry once on a fresh one (in_transaction). A failed ping raises
    DisconnectionError, on which the pool opens a fresh connection, as pre-ping does.
    """
    def returned(dbapi_connection, record):
        record.info[_RETURNED_AT] = time.monotonic()

    def checkout(dbapi_connection, record, proxy):
        since = record.info.get(_RETURNED_AT)
        if since is None or time.monotonic() - since < PING_WHEN_IDLE:
            return  # a fresh connection, or one in use a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError(f"pooled connection failed its ping: {exc}") from exc
        if alive is False:
            raise DisconnectionError("pooled connection failed its ping")

    event.listen(engine, "checkin", returned)
    event.listen(engine, "checkout", checkout)


_PYMYSQL_CRYPTOGRAPHY = ("default_backend", "hashes", "serialization", "padding")


def _import_pymysql_without_cryptography() -> None:
    """Import PyMySQL without the `cryptography` package it imports at once (~8 MB of RSS, and
    start-up time, in every cron process), loading it when a server first asks for it instead.

    PyMySQL needs it only to RSA-encrypt a password for MySQL 8's sha256_password /
    caching_sha2_password over a connection without TLS. pymysql._auth imports it in a
    try/except ImportError at module level: the import is refused while PyMySQL loads, and
    `sha2_rsa_encrypt`, the one function using it, is wrapped to import it on its first call.
    Nothing changes if PyMySQL (or cryptography) is already loaded, or if its _auth module no
    longer has that shape.
    """
    if "pymysql" in sys.modules or "cryptography" in sys.modules:
        return
    sys.modules["cryptography"] = None  # makes `from cryptography... import` raise ImportError
    try:
        import pymysql._auth as auth
    except ImportError:
        return  # no PyMySQL: SQLAlchemy reports the missing driver itself
    finally:
        del sys.modules["cryptography"]
    original = getattr(auth, "sha2_rsa_encrypt", None)
    if auth.__dict__.get("_have_cryptography") is not False or original is None:
        return

    def sha2_rsa_encrypt(password, salt, public_key):
        if not auth._have_cryptography:
            try:
                from cryptography.hazmat.backends import default_backend
                from cryptography.hazmat.primitives import hashes, serialization
                from cryptography.hazmat.primitives.asymmetric import padding
            except ImportError:
                pass  # PyMySQL's own error says what is missing
            else:
                auth.default_backend, auth.hashes, auth.serialization, auth.padding = (
                    default_backend, hashes, serialization, padding)
                auth._have_cryptography = True
        return original(password, salt, public_key)

    auth.sha2_rsa_encrypt = sha2_rsa_encrypt


def _pymysql_conversions() -> dict:
    """PyMySQL's conversions, with DATETIME and TIMESTAMP values read by datetime.fromisoformat
    (C, ~0.1 us) instead of PyMySQL's regular expression and int() calls (~2.2 us): the relay reads
    two of them per forwarded event. What fromisoformat refuses (zero dates, a fraction it cannot
    read on Python < 3.11) goes to PyMySQL's converter, so every value reads as before. Only
    cronbox's own engine gets this; the host's connections keep theirs."""
    from pymysql.constants import FIELD_TYPE
    from pymysql.converters import conversions, convert_datetime

    parse = datetime.fromisoformat

    def read_datetime(value):
        try:
            return parse(value)  # 'YYYY-MM-DD HH:MM:SS[.ffffff]', as the server sends them
        except (TypeError, ValueError):
            return convert_datetime(value)

    return {**conversions, FIELD_TYPE.DATETIME: read_datetime, FIELD_TYPE.TIMESTAMP: read_datetime}


def _mysql_engine(settings: Settings, url: str, role: str) -> Engine:
    if url.startswith("mysql+pymysql"):
        _import_pymysql_without_cryptography()
    connect_args: dict = {"charset": "utf8mb4", "connect_timeout": 10}
    if url.startswith("mysql+pymysql"):
        connect_args["conv"] = _pymysql_conversions()
    if settings.mysql_tls == "off":
        # PyMySQL otherwise negotiates TLS and loads the system CA store on every
        # connection (~20 ms); on localhost that buys nothing.
        connect_args["ssl_disabled"] = True
    elif settings.mysql_tls == "on":
        connect_args.update(ssl_verify_cert=True, ssl_verify_identity=True)
    else:
        connect_args.update(ssl_ca=settings.mysql_tls, ssl_verify_cert=True, ssl_verify_identity=True)
    engine = create_engine(
        url,
        connect_args=connect_args,
        pool_recycle=settings.pool_recycle,
        isolation_level="READ COMMITTED",
        **_pool_args(role),
    )

    if role != "lock":
        _track_cleanliness(engine)
        _ping_when_idle(engine)
        _plain_savepoints(engine)
    if role == "web":
        event.listen(engine, "reset", restore_on_return)

    @event.listens_for(engine, "connect")
    def _session_setup(dbapi_connection, _record):
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET SESSION time_zone = '+00:00'")
            if role == "cron":
                # A run holds its work connection across handlers; one that spends 25 s on the
                # network must not find it closed by a host's 20 s wait_timeout (its ack would be
                # lost and the work repeated). Cron processes are short-lived: nothing stays open.
                cursor.execute(f"SET SESSION wait_timeout = GREATEST(@@session.wait_timeout, {CRON_WAIT_TIMEOUT})")

    return engine


def _private_database_file(settings: Settings, url: str) -> None:
    """Create the SQLite database file 0600 before SQLite does (outbox.core.sqlite_files says why and
    how). A database of cronbox's own, in the instance folder, made wider by an older version is
    narrowed here; a database elsewhere (the host app's) is narrowed by `migrate`, which says so."""
    database = sqlite_files.database_path(url)
    if database is None:
        return
    sqlite_files.create_private(database)
    if database.resolve().parent == settings.instance.resolve():
        sqlite_files.narrow(database)


def _sqlite_engine(settings: Settings, url: str, role: str) -> Engine:
    if url not in ("sqlite://", "sqlite:///:memory:"):
        settings.private_dir()
        _private_database_file(settings, url)
    engine = create_engine(url, connect_args={"timeout": 30}, **_pool_args(role))
    if role != "lock":
        _track_cleanliness(engine)
        _plain_savepoints(engine)
    if role == "web":
        event.listen(engine, "reset", restore_on_return)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection, _record):
        # Take transaction control away from the sqlite3 module; we BEGIN ourselves.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a killed process (the LVE threat); only an
        # OS crash or power cut can lose the last commits.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def insert_ignore(session: Session | Connection, table, rows, *, columns: list[str] | None = None, returning=()):
    """INSERT that silently skips rows whose primary or unique key exists, on both dialects,
    without breaking the caller's transaction (no IntegrityError). Returns the result.
    `session` may be a Core Connection too.

    `rows`: a dict or a list of them; or a SELECT giving the values of `columns` (INSERT ...
    SELECT: the server copies them, none goes through Python). `returning`: columns of the rows
    inserted (never of those skipped), for a caller that checked `supports_insert_returning` first.

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
    if returning:
        statement = statement.returning(*returning)
    if columns is not None:
        return session.execute(statement.from_select(columns, rows))
    return session.execute(statement, rows)


def supports_insert_returning(session: Session | Connection) -> bool:
    """INSERT ... RETURNING (one statement; with INSERT ... SELECT, of many rows): MariaDB >= 10.5
    and SQLite >= 3.35, as SQLAlchemy detects them on the first connection; not MySQL."""
    dialect = session.dialect if isinstance(session, Connection) else session.get_bind().dialect
    return bool(dialect.insert_returning)


def delete_oldest(session: Session, table, key_columns: list, stamp, cutoff, batch: int) -> int:
    """Delete up to `batch` rows of `table` whose `stamp` is before `cutoff`, oldest first (an index on
    `stamp` serves the read), one DELETE per primary key `key_columns`: for tables keyed by more than
    one column, where `IN` over tuples is not portable. Returns how many."""
    keys = session.execute(select(*key_columns).where(stamp < cutoff).order_by(stamp).limit(batch)).all()
    for key in keys:
        session.execute(delete(table).where(*(column == value for column, value in zip(key_columns, key))))
    return len(keys)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def is_mysql(engine_or_bind) -> bool:
    return engine_or_bind.dialect.name in ("mysql", "mariadb")


def mysql_error_code(exc: BaseException) -> int | None:
    orig = getattr(exc, "orig", exc)
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def is_lock_conflict(exc: BaseException) -> bool:
    """Deadlock / lock wait timeout on MySQL, busy database on SQLite: retry the transaction."""
    if mysql_error_code(exc) in LOCK_CONFLICTS:
        return True
    return isinstance(exc, OperationalError) and any(s in str(exc.orig) for s in SQLITE_BUSY)


def is_connection_lost(exc: BaseException) -> bool:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if mysql_error_code(exc) in CONNECTION_LOST:
        return True
    text_ = str(getattr(exc, "orig", exc)).lower()
    return "lost connection" in text_ or "gone away" in text_ or "connection refused" in text_


def is_unreachable(exc: BaseException) -> bool:
    """The database cannot be reached at all (as opposed to a statement failing)."""
    text_ = str(getattr(exc, "orig", exc)).lower()
    return is_connection_lost(exc) or "can't connect" in text_ or "unable to open database" in text_


def in_transaction(sessions: sessionmaker[Session], work: Callable[[Session], T], *, retries: int = 5,
                   deadline: float | None = None, before_attempt: Callable[[], None] | None = None,
                   retry_waits: bool = True) -> T:
    """Run `work(session)` in one short transaction, retrying it on lock conflicts.

    Bounded: after `retries` conflicts the error propagates; with a `deadline` (time.monotonic), lock
    conflicts are retried while it has not passed instead, each logged (a run's writes: their waits
    are bounded by outbox.core.lock_wait, which `before_attempt` applies). `retry_waits=False`: a lock
    wait that timed out (1205, SQLite busy) is not waited again, only deadlocks are retried. `work` must
    be safe to run again, which holds for our claim/ack statements (guarded by status and claim token).
    """
    reconnected = False
    attempt = 0
    while True:
        if before_attempt is not None:
            before_attempt()
        started = time.monotonic()
        try:
            with sessions.begin() as session:
                return work(session)
        except DBAPIError as exc:
            if exc.connection_invalidated and not reconnected:
                # The connection was found dead (killed, server restarted): one more try on a
                # fresh one. Safe: our statements are guarded by status and claim token.
                reconnected = True
                log.warning("database connection lost (%s); retrying the transaction once", mysql_error_code(exc))
                continue
            if not isinstance(exc, OperationalError) or not is_lock_conflict(exc):
                raise
            if not retry_waits and mysql_error_code(exc) != DEADLOCK:
                raise
            attempt += 1
            now = time.monotonic()
            if deadline is None:
                if attempt > retries:
                    raise
                log.info("lock conflict (%s), retrying transaction (%d/%d)", mysql_error_code(exc) or "busy",
                         attempt, retries)
            else:
                if now >= deadline:
                    raise
                log.warning("lock conflict (%s) after waiting %.1fs for a lock another transaction holds; "
                            "retrying for up to %.0fs more (the run's remaining time)",
                            mysql_error_code(exc) or "busy", now - started, deadline - now)
            time.sleep(random.uniform(0.005, 0.05) * min(attempt, 10))


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


def starts_with(column, prefix: str):
    """`column` begins with `prefix`, byte for byte on every backend, as a key range the index serves.

    Not LIKE: SQLite's LIKE folds ASCII case ('OPS-LOGIN:x' LIKE 'ops-login:%'), and `_`/`%` in a
    prefix are wildcards. Both backends order these columns by bytes (SQLite's BINARY collation,
    VARBINARY on MySQL: `outbox.core.models.ExactString`), so [prefix, prefix with its last character
    raised) holds exactly the strings that begin with it."""
    if not prefix:
        raise ValueError("an empty prefix")
    return (column >= prefix) & (column < prefix[:-1] + chr(ord(prefix[-1]) + 1))
