"""A payment is written in the request; the tick (a real `python -m cronbox tick` with CRONBOX_APP) runs the
clinic's consumer inside the clinic's app, which writes the receipt and queues an SMS and an e-mail,
sent by the log drivers in the same tick. Everything happens once."""
from __future__ import annotations

from sqlalchemy import func, select

from conftest import EMAIL, PHONE, STAFF


def count(model, *where) -> int:
    from clinic.models import db

    return db.session.scalar(select(func.count()).select_from(model).where(*where))


def test_a_payment_is_followed_by_a_receipt_an_sms_and_an_email_from_one_tick(app, booked, run_cron, instance):
    from clinic.models import Appointment, Payment, Receipt, db
    from cronbox.outbox.channels.models import SendAttempt
    from cronbox.outbox.events.models import Delivery, OutboxEvent
    from cronbox.outbox.queue.models import Job

    _patient, appointment = booked
    client = app.test_client()
    paid = client.post(f"/appointments/{appointment}/pay", json={"amount": "120.00"}, headers=STAFF)
    assert paid.status_code == 201, paid.data
    again = client.post(f"/appointments/{appointment}/pay", json={"amount": "120.00"}, headers=STAFF)
    assert again.status_code == 409  # the appointment row is locked and checked: one payment

    with app.app_context():  # the payment and its event committed together, nothing ran yet
        assert count(Payment) == 1 and count(OutboxEvent) == 1
        assert db.session.get(Appointment, appointment).status == "paid"
        assert count(Receipt) == 0 and count(Job) == 0

    first = run_cron("tick", "--no-linger")
    second = run_cron("tick", "--no-linger")  # nothing left: nothing happens twice
    assert first.stdout.startswith("tick:") and second.stdout.startswith("tick:")

    with app.app_context():
        payment = db.session.scalars(select(Payment)).one()
        receipt = db.session.scalars(select(Receipt)).one()  # written by the consumer through db.session
        assert receipt.payment_id == payment.id and receipt.number == f"R-{payment.id:06d}"
        assert [d.status for d in db.session.scalars(select(Delivery))] == ["done"]
        jobs = {job.handler: job.status for job in db.session.scalars(select(Job))}
        assert jobs == {"cronbox.sms": "done", "cronbox.email": "done"}
        attempts = sorted((a.channel, a.outcome) for a in db.session.scalars(select(SendAttempt)))
        assert attempts == [("mail", "sent"), ("sms", "sent")]

    logs = "".join(path.read_text() for path in (instance / "logs").glob("cronbox-*.log"))
    assert "sms (log driver)" in logs and "mail (log driver)" in logs
    assert PHONE not in logs and EMAIL not in logs  # recipients are masked in the logs


def test_a_refused_payment_records_nothing(app, booked):
    from clinic.models import Payment
    from cronbox.outbox.events.models import OutboxEvent

    _patient, appointment = booked
    client = app.test_client()
    assert client.post(f"/appointments/{appointment}/pay", json={"amount": "12.00"}, headers=STAFF).status_code == 400
    assert client.post(f"/appointments/{appointment}/pay", json={"amount": "x"}, headers=STAFF).status_code == 400
    assert client.post("/appointments/999/pay", json={"amount": "120.00"}, headers=STAFF).status_code == 404
    assert client.post(f"/appointments/{appointment}/pay", json={"amount": "120.00"}).status_code == 401
    with app.app_context():
        assert count(Payment) == 0 and count(OutboxEvent) == 0
