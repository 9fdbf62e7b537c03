"""Engines fit for a shared host: cronbox's own connections, set up with SQLAlchemy's public API
(create_engine's arguments, the driver's connect_args, pool and connection events).

- MySQL/MariaDB: every session in UTC (`time_zone='+00:00'`) and at READ COMMITTED:
  under REPEATABLE READ a claim's next-key locks would block the app's record()
  and wait on its open transactions. A ping at checkout of a connection that sat idle
  (see _ping_when_idle) plus a pool_recycle below the host's (often 20-60 s)
  wait_timeout, because idle connections are killed.
  Cron processes get a pool of exactly one connection, no overflow: the account
  may have max_user_connections as low as 3.
- PostgreSQL (psycopg 3, the `cronbox[postgresql]` extra): READ COMMITTED (the server's default,
  set anyway: a role or database may default to another), every session in UTC, TCP keepalives so a
  dead peer is noticed, the same pools, ping-when-idle and cleanliness tracking as MySQL. Whatever
  driver the host's URL names (`postgresql://`, `postgres://`, `postgresql+psycopg2://`), cronbox's
  own engines use psycopg 3 (`engine_url`): one driver to test, binary wheels so cPanel needs no
  compiler, and the host's engine keeps its own driver for `record(db.session, ...)`.
- SQLite (the embedded default): WAL, busy_timeout, and BEGIN IMMEDIATE for
  every transaction, so a reader never has to upgrade to a writer halfway (that
  fails at once with "database is locked" instead of waiting).

The drivers (PyMySQL, psycopg) and the dialects are used as they come: nothing here changes a module,
a class or a dialect's methods, so a host app's engines in the same process behave as without cronbox.
"""
from __future__ import annotations

import time

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool, QueuePool

from cronbox.outbox.core import sqlite_files
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.lock_wait import SQLITE_BUSY_MS, restore_on_return
from cronbox.outbox.core.settings import Settings

CRON_WAIT_TIMEOUT = 3600  # seconds; see _session_setup


def make_engine(settings: Settings, *, role: str = "cron", url: str | None = None) -> Engine:
    """role: "cron" (one pooled connection), "web" (small pool) or "lock" (no pool: one dedicated connection)."""
    url = engine_url(url or settings.database_url)
    if url.startswith("sqlite"):
        return _sqlite_engine(settings, url, role)
    if url.startswith("postgresql"):
        return _postgresql_engine(settings, url, role)
    return _mysql_engine(settings, url, role)


POSTGRESQL_SCHEMES = ("postgresql", "postgres")
PSYCOPG = "postgresql+psycopg"


def engine_url(url: str) -> str:
    """The URL cronbox's own engines connect with: a PostgreSQL URL with any driver (or none) gets
    psycopg 3; the rest as given."""
    scheme = url.split(":", 1)[0]
    if scheme.split("+", 1)[0] not in POSTGRESQL_SCHEMES or scheme == PSYCOPG:
        return url
    return make_url(url).set(drivername=PSYCOPG).render_as_string(hide_password=False)


def _require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401  (the dialect imports it too; asked here for a one-line answer)
    except ImportError:
        raise SettingsError("a PostgreSQL DATABASE_URL needs psycopg 3: pip install 'cronbox[postgresql]' "
                            "(or psycopg[binary])") from None


def _pool_args(role: str) -> dict:
    if role == "lock":
        return {"poolclass": NullPool}
    # Reset on return is done by _reset_on_return below.
    # QueuePool named (it is the default for files and servers): SQLAlchemy would pick a
    # SingletonThreadPool for a named in-memory SQLite database (`file:NAME?mode=memory&cache=shared`).
    if role == "cron":
        return {"poolclass": QueuePool, "pool_size": 1, "max_overflow": 0, "pool_timeout": 30, "pool_reset_on_return": None}
    return {"poolclass": QueuePool, "pool_size": 2, "max_overflow": 2, "pool_timeout": 10, "pool_reset_on_return": None}


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


def _server_engine(settings: Settings, url: str, role: str, connect_args: dict) -> Engine:
    """What both servers' engines share: READ COMMITTED, the pool of the role, recycling, and (but a
    lock's connection) the clean-return and ping-when-idle listeners; a web pool's connections get
    their lock-wait default back on return."""
    engine = create_engine(url, connect_args=connect_args, pool_recycle=settings.pool_recycle,
                           isolation_level="READ COMMITTED", **_pool_args(role))
    if role != "lock":
        _track_cleanliness(engine)
        _ping_when_idle(engine)
    if role == "web":
        event.listen(engine, "reset", restore_on_return)
    return engine


def _mysql_engine(settings: Settings, url: str, role: str) -> Engine:
    connect_args: dict = {"charset": "utf8mb4", "connect_timeout": 10}
    if settings.mysql_tls == "off":
        # PyMySQL otherwise negotiates TLS and loads the system CA store on every
        # connection (~20 ms); on localhost that buys nothing.
        connect_args["ssl_disabled"] = True
    elif settings.mysql_tls == "on":
        connect_args.update(ssl_verify_cert=True, ssl_verify_identity=True)
    else:
        connect_args.update(ssl_ca=settings.mysql_tls, ssl_verify_cert=True, ssl_verify_identity=True)
    engine = _server_engine(settings, url, role, connect_args)

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


KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def _postgresql_engine(settings: Settings, url: str, role: str) -> Engine:
    _require_psycopg()
    engine = _server_engine(settings, url, role,
                            {"connect_timeout": 10, "application_name": "cronbox", **KEEPALIVES})

    @event.listens_for(engine, "connect")
    def _session_setup(dbapi_connection, _record):
        # SET outside a transaction (psycopg otherwise opens one, and a rollback would undo it):
        # SQLAlchemy's documented recipe for per-connection settings.
        dbapi_connection.autocommit = True
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SET TIME ZONE 'UTC'")
        finally:
            dbapi_connection.autocommit = False

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


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
