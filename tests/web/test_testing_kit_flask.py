"""cronbox.testing inside a host Flask app: its test client, its app context, its Flask-SQLAlchemy
db.session (the handlers' ctx.session, through cronbox.web.hosting), manual and inline modes."""
from __future__ import annotations

import os

import pytest
from flask import Flask, current_app
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from cronbox import Cronbox, record
from cronbox.outbox.channels.jobs import send_sms
from cronbox.outbox.events.consumers import consumer
from cronbox.testing import Kit, KitError
from tests.conftest import ONE_MYSQL_MODE

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)  # the claim mode is test_testing_kit.py's subject, not this


class Base(DeclarativeBase):
    pass


class Receipt(Base):
    __tablename__ = "kit_host_receipts"
    id: Mapped[int] = mapped_column(primary_key=True)
    visit: Mapped[int]
    app: Mapped[str] = mapped_column(String(32))


@pytest.fixture
def env(env):
    return {**env, "CRONBOX_SMS_DRIVER": "test"}


@pytest.fixture
def host(runtime, registry, database, tmp_path, monkeypatch):
    """A host app on the test's database: a /pay route recording in its db.session's transaction, and a
    consumer writing through db.session and dispatching an SMS (cronbox's own job)."""
    for name in list(os.environ):
        if name.startswith("CRONBOX_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    app = Flask("kit_host", root_path=str(tmp_path), instance_path=str(tmp_path / "instance"))
    app.config.update(SQLALCHEMY_DATABASE_URI=database.url, CRONBOX_HANDLERS="", TESTING=True)
    db = SQLAlchemy(model_class=Base)
    db.init_app(app)
    with app.app_context():
        db.create_all()
    Cronbox().init_app(app, db=db).attach_cron(runtime)  # the kit runs on this app's runtime
    registry.jobs.add(send_sms.job)

    @consumer("visit.paid", name="host.receipt", registry=registry)
    def receipt(event, ctx):
        db.session.add(Receipt(visit=event.payload["visit"], app=current_app.name))
        send_sms.dispatch(db.session, {"to": "+989121234567", "text": f"Receipt for visit {event.payload['visit']}"})

    @app.post("/pay/<int:visit>")
    def pay(visit: int):
        record(db.session, "visit.paid", {"visit": visit})
        if visit == 0:  # refused: nothing of the request stays
            db.session.rollback()
            return "refused", 400
        db.session.commit()
        return "paid", 201

    yield app, db
    with app.app_context():
        db.engine.dispose()


def receipts(app, db) -> list[tuple[int, str]]:
    with app.app_context():
        return [tuple(row) for row in db.session.execute(select(Receipt.visit, Receipt.app))]


def test_manual_mode_in_a_flask_app(host):
    app, db = host
    with Kit(app) as kit:
        client = app.test_client()
        assert client.post("/pay/0").status_code == 400
        kit.refute_recorded()  # the refused request rolled back: nothing
        assert client.post("/pay/7").status_code == 201
        kit.assert_recorded("visit.paid", visit=7)
        kit.refute_dispatched(send_sms)  # nothing runs until the test says so
        with app.app_context():  # inside the test's own app context too
            assert kit.deliver().done == 1
        assert receipts(app, db) == [(7, "kit_host")]  # db.session was the delivery's session
        kit.assert_dispatched(send_sms, to="+989121234567")
        kit.drain()
        assert [(m.to, m.text) for m in kit.outbox.sms] == [("+989121234567", "Receipt for visit 7")]


def test_inline_mode_watches_the_apps_db_session(host):
    app, db = host
    with Kit(app, mode="inline") as kit:
        assert app.test_client().post("/pay/8").status_code == 201
        # The request's commit ran the consumer and its SMS job before the response came back.
        assert receipts(app, db) == [(8, "kit_host")]
        [sms] = kit.assert_dispatched(send_sms)
        assert sms.done and [m.text for m in kit.outbox.sms] == ["Receipt for visit 8"]


def test_inline_mode_without_the_apps_db_is_refused(runtime, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("CRONBOX_") or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    app = Flask("bare", root_path=str(tmp_path), instance_path=str(tmp_path / "instance"))
    app.config.update(CRONBOX_HANDLERS="")
    Cronbox().init_app(app, settings=runtime.settings).attach_cron(runtime)
    with pytest.raises(KitError, match="inline mode needs the session the app writes through: pass session="):
        Kit(app, mode="inline").start()
    with pytest.raises(KitError, match="this Flask app has no cronbox"):
        Kit(Flask("other"))
