"""What happens after a payment, run by the cron tick inside the clinic's app (CRONBOX_HANDLERS).

The consumer runs in an app context of create_app()'s app, and `db.session` is the delivery's
session: the receipt and the two jobs commit together with the delivery's ack, exactly once.
A failed attempt rolls all three back and is retried with backoff.
"""
from __future__ import annotations

from flask import current_app

import outbox
from outbox.channels import send_email, send_sms

from .models import Appointment, Payment, Receipt, db


@outbox.consumer("appointment.paid", name="clinic.receipt")
def send_receipt(event, ctx):
    appointment = Appointment.query.filter_by(id=event.payload["appointment_id"]).one()
    payment = db.session.get(Payment, event.payload["payment_id"])
    receipt = Receipt(payment_id=payment.id, number=f"R-{payment.id:06d}")
    db.session.add(receipt)

    clinic = current_app.config["CLINIC_NAME"]
    when = appointment.starts_at.strftime("%d %b %H:%M")
    patient = appointment.patient
    send_sms.dispatch(db.session, {"to": patient.phone,
                                   "text": f"{clinic}: payment received for {when}. Receipt {receipt.number}."})
    send_email.dispatch(db.session, {"to": patient.email, "subject": f"{clinic} receipt {receipt.number}",
                                     "text": f"Dear {patient.name},\n\nwe received {payment.amount} for your "
                                             f"appointment on {when}.\n\n{clinic}"})
