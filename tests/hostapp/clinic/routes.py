"""The host's own routes: paying records the payment and the event in one transaction of db.session."""
from __future__ import annotations

from flask import Blueprint, abort, jsonify, request

import cronbox
from cronbox import storage
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
    cronbox.record(db.session, "appointment.paid", {"appointment": appointment.id}, key=f"appointment:{appointment.id}")
    if request.form.get("fail"):
        db.session.rollback()  # the request fails: neither the payment nor the event exists
        abort(409)
    db.session.commit()
    return jsonify(ok=True)


@bp.post("/scans")
def scan():
    """Queues a scan for the background job that seals it (clinic.handlers.seal_scan)."""
    from clinic.handlers import seal_scan  # the handlers module imports the app's package

    seal_scan.dispatch(db.session, {"text": request.form["text"], "owner": request.form["owner"]})
    db.session.commit()
    return jsonify(ok=True), 202


@bp.get("/scans/<file_id>")
def read_scan(file_id: str):
    """The sealed file's bytes, opened through the module-level storage in this request."""
    opened = storage.open_file(db.session, file_id)
    try:
        return b"".join(bytes(part) for part in opened.iter_range(0, opened.size))
    finally:
        opened.close()


@bp.post("/scans/<file_id>/link")
def link(file_id: str):
    """A download link made with the module-level grant() and signed_url() in a request."""
    grant_id = storage.grant(db.session, file_id, request.form["subject"], expires_in=600)
    db.session.commit()
    return storage.signed_url(grant_id, ttl=60)
