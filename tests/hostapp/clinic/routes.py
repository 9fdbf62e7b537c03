"""The host's own routes: paying records the payment and the event in one transaction of db.session."""
from __future__ import annotations

from flask import Blueprint, abort, jsonify, request

import outbox
from clinic import db
from clinic.models import Appointment, Payment

bp = Blueprint("clinic", __name__)


@bp.post("/appointments")
def book():
    appointment = Appointment(patient=request.form["patient"])
    db.session.add(appointment)
    db.session.commit()
    return jsonify(id=appointment.id), 201


@bp.post("/appointments/<int:appointment_id>/pay")
def pay(appointment_id: int):
    appointment = db.session.get(Appointment, appointment_id) or abort(404)
    db.session.add(Payment(appointment_id=appointment.id, amount=request.form.get("amount", "120.00")))
    outbox.record(db.session, "appointment.paid", {"appointment": appointment.id}, key=f"appointment:{appointment.id}")
    if request.form.get("fail"):
        db.session.rollback()  # the request fails: neither the payment nor the event exists
        abort(409)
    db.session.commit()
    return jsonify(ok=True)
