"""What happens after a payment, and every evening, run by the cron tick inside the clinic's app
(CRONBOX_HANDLERS).

The consumer runs in an app context of create_app()'s app, and `db.session` is the delivery's
session: the receipt and the two jobs commit together with the delivery's ack, exactly once.
A failed attempt rolls all three back and is retried with backoff. The SMS and the e-mail are
jobs of their own (retried apart, rate-limited, paused when a provider is out of credit).
The evening task reminds tomorrow's patients by SMS.
"""
from __future__ import annotations

from datetime import datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

from flask import current_app
from sqlalchemy import select

from cronbox import consumer, schedule, send_email, send_sms

from .models import Appointment, Payment, Receipt, db

CLINIC_ZONE = "Asia/Tehran"  # appointment times are the clinic's wall-clock times


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


@schedule.cron("0 18 * * *", tz=CLINIC_ZONE, name="clinic.remind_tomorrow")
def remind_tomorrow(ctx):
    """At 18:00 at the clinic, one SMS to each patient with an appointment tomorrow. The task's
    `db.session` commits when it returns; the unique key makes a reminder already queued for an
    appointment a no-op, so a slot run twice by hand (`schedule run`) texts nobody twice."""
    today = ctx.slot.replace(tzinfo=timezone.utc).astimezone(ZoneInfo(CLINIC_ZONE)).date()
    start = datetime.combine(today + timedelta(days=1), time())
    tomorrow = select(Appointment).where(Appointment.starts_at >= start,
                                         Appointment.starts_at < start + timedelta(days=1))
    clinic = current_app.config["CLINIC_NAME"]
    for appointment in db.session.scalars(tomorrow):
        text = f"{clinic}: see you tomorrow at {appointment.starts_at:%H:%M}."
        send_sms.dispatch(db.session, {"to": appointment.patient.phone, "text": text},
                          unique_key=f"reminder:{appointment.id}")
