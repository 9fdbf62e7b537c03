"""The host's `db.session` inside its handlers (cronbox.web.hosting.HostScope), in process: while a handler
runs it is the handler's ctx.session, registered for the app context cronbox pushes through the
host's session registry's public set()/clear(); the host's scoped session, its registry and its
factory stay its own before, during and after cronbox, and outside handlers `db.session` is a
session of the host's class on the host's engine. Building ctx.session to serve it that way is not
using it: a host handler that touches no session keeps the batched ack."""
from __future__ import annotations

import dataclasses
import os

import flask_sqlalchemy.session
import pytest
from flask import Flask, current_app
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String, event, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import cronbox
from cronbox import Cronbox
from cronbox.outbox.engine.context import HandlerSession
from cronbox.outbox.events.consumers import consumer
from tests.helpers import deliveries, relay


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "clinic_host_notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    event_id: Mapped[int]
    source: Mapped[str] = mapped_column(String(32))


@pytest.fixture
def host(runtime, database, tmp_path, monkeypatch):
    """A host app with Flask-SQLAlchemy on the test's database, its own table created, no cronbox yet."""
    for name in list(os.environ):
        if name.startswith("CRONBOX_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    # Leases long enough that finished quiet items wait for one batched ack (CRONBOX_LEASE_MARGIN=0
    # in the suite makes every lease just the handler's timeout, which flushes after each item).
    runtime.settings = dataclasses.replace(runtime.settings, lease_margin=30.0)
    root = tmp_path / "clinic"
    root.mkdir()
    app = Flask("clinic", root_path=str(root), instance_path=str(root / "instance"))
    app.config.update(SQLALCHEMY_DATABASE_URI=database.url, CRONBOX_HANDLERS="")
    db = SQLAlchemy(model_class=Base)
    db.init_app(app)
    with app.app_context():
        db.create_all()
    return app, db


def record(runtime, count: int) -> list[int]:
    with runtime.sessions.begin() as session:
        events = [cronbox.record(session, "visit.paid", {"n": n}) for n in range(count)]
        session.flush()
        return [e.id for e in events]


def notes(app, db) -> list[tuple[int, str]]:
    with app.app_context():
        return sorted(tuple(row) for row in db.session.execute(select(Note.event_id, Note.source)))


class AckCommits:
    """How many deliveries each committed transaction acked (an UPDATE setting finished_at on
    cronbox_deliveries, counted by its rowcount): [5] is five acks committed together."""

    def __init__(self, engine):
        self.sizes: list[int] = []
        self._pending = 0
        event.listen(engine, "after_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)
        event.listen(engine, "rollback", self._rollback)

    def _statement(self, connection, cursor, statement, *args):
        if statement.lstrip().upper().startswith("UPDATE CRONBOX_DELIVERIES") and "finished_at" in statement:
            self._pending += cursor.rowcount

    def _commit(self, connection):
        if self._pending:
            self.sizes.append(self._pending)
        self._pending = 0

    def _rollback(self, connection):
        self._pending = 0


def test_the_hosts_session_registry_and_factory_stay_its_own(runtime, registry, host):
    app, db = host
    scoped, registry_before = db.session, db.session.registry
    factory = registry_before.createfunc
    state = Cronbox().init_app(app, db=db)
    state.attach_cron(runtime)  # what a cron process does: handlers run in the host app's scope
    assert db.session is scoped and scoped.registry is registry_before and registry_before.createfunc is factory

    seen = []

    @consumer("visit.paid", name="host.notes", registry=registry)
    def note(event, ctx):
        seen.append((current_app.name, db.session() is ctx.session))
        db.session.add(Note(event_id=event.id, source="db.session"))
        ctx.session.add(Note(event_id=event.id, source="ctx.session"))
        if event.payload["n"] == 1:
            raise RuntimeError("declined")  # its writes through either session roll back together

    ids = record(runtime, 2)
    stats = relay(runtime)
    assert stats.done == 1 and seen == [("clinic", True), ("clinic", True)]
    assert notes(app, db) == [(ids[0], "ctx.session"), (ids[0], "db.session")]
    assert [d.status for d in deliveries(runtime)] == ["done", "pending"]

    assert db.session is scoped and scoped.registry is registry_before and registry_before.createfunc is factory
    with app.app_context():  # outside handlers: the host's own session, on the host's engine
        session = db.session()
        assert isinstance(session, flask_sqlalchemy.session.Session) and not isinstance(session, HandlerSession)
        assert session.get_bind(Note.__mapper__) is db.engine
    with app.app_context():
        assert db.session() is not session  # one per app context, as the host configured it


@pytest.mark.parametrize("writes", [False, True], ids=["touches-no-session", "writes-through-db-session"])
def test_a_host_handler_that_touches_no_session_keeps_the_batched_ack(runtime, registry, host, writes):
    app, db = host
    Cronbox().init_app(app, db=db).attach_cron(runtime)

    @consumer("visit.paid", name="host.quiet", registry=registry)
    def handle(event, ctx):
        assert current_app.name == "clinic"
        if writes:
            db.session.add(Note(event_id=event.id, source="db.session"))

    ids = record(runtime, 5)
    acks = AckCommits(runtime.engine)
    stats = relay(runtime)
    assert stats.done == 5 and all(d.status == "done" for d in deliveries(runtime))
    if writes:  # each ack commits with its handler's writes, one transaction each
        assert acks.sizes == [1, 1, 1, 1, 1]
        assert notes(app, db) == [(i, "db.session") for i in ids]
    else:  # nothing to protect: the five acks commit together
        assert acks.sizes == [5]
        assert notes(app, db) == []


def test_a_host_handler_that_touches_no_session_and_times_out_keeps_the_connection(runtime, registry, host):
    """The timeout of a handler that never began work on the connection is an ordinary failure: the
    connection is not dropped (it was not mid-query), the next item runs on it."""
    app, db = host
    Cronbox().init_app(app, db=db).attach_cron(runtime)
    invalidated = []
    event.listen(runtime.engine, "invalidate", lambda *args: invalidated.append(args))

    # 2 s: the second item's db.session.add ends well within it however loaded the machine; the first
    # spins until the timer ends it.
    @consumer("visit.paid", name="host.slow", timeout=2, backoff=[60], registry=registry)
    def slow(event, ctx):
        if event.payload["n"] == 0:
            while True:
                pass
        db.session.add(Note(event_id=event.id, source="db.session"))

    ids = record(runtime, 2)
    stats = relay(runtime)
    rows = deliveries(runtime)
    assert [d.status for d in rows] == ["pending", "done"] and "timeout" in rows[0].last_error.lower()
    assert stats.done == 1 and invalidated == []
    assert notes(app, db) == [(ids[1], "db.session")]


@pytest.mark.parametrize("writes", [False, True], ids=["touches-no-session", "writes-through-db-session"])
def test_grouped_host_handlers_commit_together_through_db_session(runtime, registry, host, writes):
    """A grouped host handler's db.session works in its savepoint of the group's transaction: the
    members' writes and acks commit once; members that touch nothing are acked together as well."""
    app, db = host
    Cronbox().init_app(app, db=db).attach_cron(runtime)
    # One group, however loaded the machine: neither the group's time nor the ack window it is capped
    # by (CRONBOX_ACK_FLUSH, 0.5 s by default) ends it before its members are done.
    runtime.settings = dataclasses.replace(runtime.settings, group_ms=20_000, ack_flush=20.0)

    @consumer("visit.paid", name="host.grouped", grouped=True, registry=registry)
    def handle(event, ctx):
        if writes:
            db.session.add(Note(event_id=event.id, source="db.session"))
            if event.payload["n"] == 2:
                db.session.flush()
                raise RuntimeError("declined")  # its savepoint rolls back; the others' writes stay

    ids = record(runtime, 5)
    acks = AckCommits(runtime.engine)
    stats = relay(runtime)
    if writes:
        assert stats.done == 4 and acks.sizes == [4]
        assert notes(app, db) == [(i, "db.session") for n, i in enumerate(ids) if n != 2]
    else:
        assert stats.done == 5 and acks.sizes == [5] and notes(app, db) == []
