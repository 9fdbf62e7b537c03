"""A clinic's sealed handlers for the plaintext grep test (tests/db/test_sealed_payloads.py): an event type
declared sealed whose consumer texts the patient (cronbox.sms, sealed by default) and runs a sealed job."""
from __future__ import annotations

from cronbox.outbox.channels import send_sms
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.queue.jobs import job


@job("clinic", name="sealed_clinic.file_result", sealed=True)
def file_result(payload, ctx):
    assert payload["note"].startswith("PHI-MARKER")


@consumer("sealed_clinic.result_ready", name="sealed_clinic.notify_patient", sealed=True)
def notify_patient(event, ctx):
    send_sms.dispatch(ctx.session, {"to": event.payload["phone"], "text": event.payload["text"]})
    file_result.dispatch(ctx.session, {"note": event.payload["text"]})
