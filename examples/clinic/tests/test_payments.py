"""A payment is written in the request; its `appointment.paid` event is run by the clinic's consumer
inside the clinic's app, which writes the receipt and queues an SMS and an e-mail; the jobs send them.

The first tests run that path with cronbox's test kit, in this process, through cronbox's real relay
and worker on the test database: each step looked at, a refused SMS retried after its backoff on the
kit's clock, and inline mode. The last runs it as production does, with the cron line: a real
`python -m cronbox tick` building the app from CRONBOX_APP. Everything happens once."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select

from conftest import EMAIL, PHONE, STAFF
from cronbox import send_email, send_sms

SMS_TEXT = "Example Clinic: payment received for 03 Dec 09:30. Receipt R-000001."


def count(model, *where) -> int:
    from clinic.models import db

    return db.session.scalar(select(func.count()).select_from(model).where(*where))


def pay(app, appointment: int, amount: str = "120.00"):
    return app.test_client().post(f"/appointments/{appointment}/pay", json={"amount": amount}, headers=STAFF)


def test_a_payment_is_followed_by_a_receipt_an_sms_and_an_email(app, booked, cronbox_kit):
    from clinic.models import Payment, Receipt, db

    _patient, appointment = booked
    assert pay(app, appointment).status_code == 201
    assert pay(app, appointment).status_code == 409  # the appointment row is locked and checked: one payment

    # The payment and its event committed together; nothing ran yet.
    [event] = cronbox_kit.assert_recorded("appointment.paid", appointment_id=appointment)
    assert event.key == f"appointment:{appointment}"
    cronbox_kit.refute_dispatched(send_sms)

    assert cronbox_kit.deliver().done == 1  # the consumer, as the tick's relay runs it
    with app.app_context():
        payment = db.session.scalars(select(Payment)).one()
        receipt = db.session.scalars(select(Receipt)).one()  # written by the consumer through db.session
        assert receipt.payment_id == payment.id and receipt.number == "R-000001"
    cronbox_kit.assert_dispatched(send_sms, to=PHONE, text=SMS_TEXT)
    cronbox_kit.assert_dispatched(send_email, to=EMAIL, subject="Example Clinic receipt R-000001")

    assert cronbox_kit.drain().done == 2  # the SMS and the e-mail jobs, as the worker runs them
    assert [(m.to, m.text) for m in cronbox_kit.outbox.sms] == [(PHONE, SMS_TEXT)]
    [mail] = cronbox_kit.outbox.mail
    assert mail.to == EMAIL and "we received 120.00 for your appointment on 03 Dec 09:30" in mail.text
    assert all(job.done for job in cronbox_kit.dispatched())

    assert (cronbox_kit.deliver().handled, cronbox_kit.drain().handled) == (0, 0)  # nothing happens twice
    assert len(cronbox_kit.outbox.messages) == 2


def test_an_sms_the_gateway_refused_is_sent_after_its_backoff(app, booked, cronbox_kit):
    _patient, appointment = booked
    cronbox_kit.outbox.refuse("sms", reason="gateway down")  # the SMS provider fails the next send
    pay(app, appointment)
    cronbox_kit.deliver()
    cronbox_kit.drain()

    [sms] = cronbox_kit.dispatched(send_sms)
    assert sms.retrying and sms.attempts == 1 and sms.last_error == "SendFailed: gateway down"
    assert cronbox_kit.outbox.sms == [] and len(cronbox_kit.outbox.mail) == 1  # the e-mail went on its own

    cronbox_kit.clock.advance(seconds=20)  # send_sms backs off 30 s (+-20%): not due yet
    assert cronbox_kit.drain().handled == 0
    cronbox_kit.drain(until=timedelta(minutes=1))  # what comes due within the minute runs, the clock moving to it
    [sms] = cronbox_kit.dispatched(send_sms)
    assert sms.done and sms.attempts == 2
    assert [m.text for m in cronbox_kit.outbox.sms] == [SMS_TEXT]


def test_inline_the_payments_request_runs_what_follows_it(app, booked, cronbox_inline):
    from clinic.models import Receipt

    _patient, appointment = booked
    assert pay(app, appointment).status_code == 201
    # Its commit ran the consumer and both jobs in this process before the response came back.
    with app.app_context():
        assert count(Receipt) == 1
    assert [m.text for m in cronbox_inline.outbox.sms] == [SMS_TEXT]


def test_a_refused_payment_records_nothing(app, booked, cronbox_kit):
    from clinic.models import Payment

    _patient, appointment = booked
    assert pay(app, appointment, "12.00").status_code == 400
    assert pay(app, appointment, "x").status_code == 400
    assert pay(app, 999).status_code == 404
    assert app.test_client().post(f"/appointments/{appointment}/pay", json={"amount": "120.00"}).status_code == 401
    with app.app_context():
        assert count(Payment) == 0
    cronbox_kit.refute_recorded()


def test_the_cron_line_runs_the_same_path(app, booked, run_cron, instance):
    """Production's way: the tick as cron runs it, a real subprocess building the clinic's app (CRONBOX_APP),
    its SMS and e-mail through the log drivers (the environment's)."""
    from clinic.models import Receipt, db
    from cronbox.outbox.channels.models import SendAttempt
    from cronbox.outbox.events.models import Delivery
    from cronbox.outbox.queue.models import Job

    _patient, appointment = booked
    assert pay(app, appointment).status_code == 201
    first = run_cron("tick", "--no-linger")
    second = run_cron("tick", "--no-linger")  # nothing left: nothing happens twice
    assert first.stdout.startswith("tick:") and second.stdout.startswith("tick:")

    with app.app_context():
        assert count(Receipt) == 1
        assert [d.status for d in db.session.scalars(select(Delivery))] == ["done"]
        jobs = {job.handler: job.status for job in db.session.scalars(select(Job))}
        assert jobs == {"cronbox.sms": "done", "cronbox.email": "done"}
        attempts = sorted((a.channel, a.outcome) for a in db.session.scalars(select(SendAttempt)))
        assert attempts == [("mail", "sent"), ("sms", "sent")]

    logs = "".join(path.read_text() for path in (instance / "logs").glob("cronbox-*.log"))
    assert "sms (log driver)" in logs and "mail (log driver)" in logs
    assert PHONE not in logs and EMAIL not in logs  # recipients are masked in the logs
