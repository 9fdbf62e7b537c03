"""What happens after a payment, run by the cron tick inside the clinic's app (CRONBOX_HANDLERS).

The consumer runs in an app context of create_app()'s app, and `db.session` is the delivery's
session: the receipt and the two jobs commit together with the delivery's ack, exactly once.
A failed attempt rolls all three back and is retried with backoff. The SMS and the e-mail are
jobs of their own (retried apart, rate-limited, paused when a provider is out of credit).
"""
from __future__ import annotations

from flask import current_app

from cronbox import consumer, send_email, send_sms

from .models import Appointment, Payment, Receipt, db


@consumer("appointment.paid", name="clinic.receipt")
def send_receipt(event, ctx):
    appointment = Appointment.query.filter_by(id=event.payload["appointment_id"]).one()
    payment = db.session.get(Payment, event.payload["payment_id"])
    receipt = Receipt(payment_id=payment.id, number=f"R-{payment.id:06d}")
    db.session.add(receipt)  # commits with the delivery's ack, exactly once

    clinic = current_app.config["CLINIC_NAME"]
    when = appointment.starts_at.strftime("%d %b %H:%M")
    patient = appointment.patient
    sms = f"{clinic}: payment received for {when}. Receipt {receipt.number}."
    subject = f"{clinic} receipt {receipt.number}"
    text = f"Dear {patient.name},\n\nwe received {payment.amount} for your appointment on {when}.\n\n{clinic}"
    send_sms.dispatch(db.session, {"to": patient.phone, "text": sms})
    send_email.dispatch(db.session, {"to": patient.email, "subject": subject, "text": text})
