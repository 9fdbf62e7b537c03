"""The clinic's routes: take a payment, receive a scan, hand out a download link.

Staff calls them with `Authorization: Bearer <CLINIC_STAFF_TOKEN>`; a real clinic would put its
own login here. cronbox's own parts (/files, /health, /cron/tick, /ops) have their own guards.
"""
from __future__ import annotations

import hmac
import secrets
from decimal import Decimal, InvalidOperation

from flask import Blueprint, abort, current_app, jsonify, request
from sqlalchemy import select

from cronbox import UploadRefused, record, request_client, seal_upload, sealed_upload_route

from . import cronbox
from .models import Appointment, Patient, Payment, db

bp = Blueprint("clinic", __name__)


@bp.before_request
def staff_only():
    token = current_app.config.get("CLINIC_STAFF_TOKEN")
    if not token:
        abort(503, "set CLINIC_STAFF_TOKEN")
    sent = request.headers.get("Authorization", "")
    if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        abort(401)


@bp.post("/appointments/<int:appointment_id>/pay")
def pay(appointment_id: int):
    """The payment is written here, synchronously; the outbox event only carries what follows it
    (receipt, SMS, e-mail), committed in the same transaction or not at all."""
    try:
        amount = Decimal(str((request.get_json(silent=True) or {}).get("amount")))
    except InvalidOperation:
        abort(400, "amount must be a number")
    appointment = db.session.execute(  # lock the appointment: one payment per appointment, in key order
        select(Appointment).where(Appointment.id == appointment_id).with_for_update()).scalar_one_or_none()
    if appointment is None:
        abort(404)
    if appointment.status == "paid":
        abort(409, "already paid")
    if amount != appointment.fee:
        abort(400, f"the fee is {appointment.fee}")
    payment = Payment(appointment_id=appointment.id, amount=amount, reference=secrets.token_hex(8))
    appointment.status = "paid"
    db.session.add(payment)
    db.session.flush()  # the payment's id, for the event
    record(db.session, "appointment.paid", {"appointment_id": appointment.id, "payment_id": payment.id},
           key=f"appointment:{appointment.id}")
    db.session.commit()
    return jsonify(payment=payment.id, reference=payment.reference), 201


@bp.post("/patients/<int:patient_id>/scans")
@sealed_upload_route  # with Flask-WTF too (its CSRFProtect is found): the token a field before the file
def upload_scan(patient_id: int):
    """A multipart form with one file part, sealed while it streams: never touch request.files here."""
    db.get_or_404(Patient, patient_id)
    db.session.commit()  # no transaction (nor pooled connection) held while the upload streams in
    try:
        upload = seal_upload(session=db.session, owner=f"patient:{patient_id}")
    except UploadRefused as refused:  # 400, 411, 413, 507: nothing of it was kept
        return jsonify(error=refused.message), refused.status
    db.session.commit()
    return jsonify(id=upload.file_id, size=upload.size, filename=upload.filename, fields=upload.fields), 201


@bp.post("/patients/<int:patient_id>/scans/<file_id>/link")
def scan_link(patient_id: int, file_id: str):
    """An absolute link of five minutes (on CRONBOX_BASE_URL), for at most three downloads in a day."""
    files = cronbox.storage  # this app's sealed storage, as db.session is its session
    if files.owner(db.session, file_id) != f"patient:{patient_id}":
        abort(404)
    grant = files.grant(db.session, file_id, f"patient:{patient_id}", expires_in=86400, max_uses=3)
    url = files.signed_url(grant, ttl=300, session=db.session, client=request_client(),  # audited: who asked
                           absolute=True)
    db.session.commit()  # the grant and its audit entry
    return jsonify(url=url), 201
