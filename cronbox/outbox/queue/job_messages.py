"""The message of a job forwarded to the broker, made by the publisher and read by the broker worker.

The body names the row and the claim it was published under, nothing more: `{"job": 42,
"claim_token": "..."}` (JSON). The payload stays in the database (no PHI on the broker), and the row
is the job's only state: a worker runs the job only while the row still holds that token
(jobstore.take); each job of a publish has a token of its own, so a message is worth nothing for any
other job. Properties: persistent, JSON, `message_id` "cronbox-job-<id>-<16 hex digits of the
token's SHA-256>" (the same for every copy of one claim, and safe to log: the token never is), the
job's trace id as `correlation_id`, type "cronbox.job", and headers
naming the queue and handler for an operator looking at the broker (and, on a copy published again
after its lease ran out, `x-cronbox-again`: taken alone).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from cronbox.outbox.core.text import clean_text
from cronbox.outbox.amqp.broker import Outgoing

TYPE = "cronbox.job"
CONTENT_TYPE = "application/json"
QUEUE_HEADER, HANDLER_HEADER, TRACE_HEADER = "x-cronbox-queue", "x-cronbox-handler", "x-trace-id"
# On a copy of a job a worker took and never finished, published again (jobstore.claim_to_publish): its
# job may be the one that killed that worker, so a worker takes it alone, charging no neighbour an attempt.
AGAIN_HEADER = "x-cronbox-again"
MAX_BODY = 1024  # a job message is about 70 bytes: anything larger is not one of ours


def message_for(broker_queue: str, item, *, again: bool = False) -> Outgoing:
    """The message of a claimed job (jobstore.ClaimedJob), to the default exchange, routed to `broker_queue`."""
    body = json.dumps({"job": item.id, "claim_token": item.claim_token}, separators=(",", ":")).encode()
    return Outgoing("", broker_queue, body, {
        "content_type": CONTENT_TYPE,
        "delivery_mode": 2,  # persistent
        "message_id": f"cronbox-job-{item.id}-{hashlib.sha256(item.claim_token.encode()).hexdigest()[:16]}",
        "correlation_id": item.trace_id,
        "type": TYPE,
        "app_id": "cronbox",
        "application_headers": {QUEUE_HEADER: item.queue, HANDLER_HEADER: item.handler, TRACE_HEADER: item.trace_id,
                                **({AGAIN_HEADER: True} if again else {})},
    })


def sent_again(message) -> bool:
    """Is this the copy of a job published again after its lease ran out (AGAIN_HEADER)?"""
    headers = (getattr(message, "properties", None) or {}).get("application_headers") or {}
    return bool(headers.get(AGAIN_HEADER)) if isinstance(headers, dict) else False


def shown_id(message, named: JobMessage | None = None) -> str:
    """A message's `message_id` for a log line: cleaned, cut, and without the token its body carries
    should the id hold it (a forged message's id is the sender's, and a token is never logged)."""
    shown = clean_text(str((getattr(message, "properties", None) or {}).get("message_id") or "-"), 80)
    return shown.replace(named.claim_token, "<token>") if named is not None and named.claim_token in shown else shown


@dataclass(frozen=True)
class JobMessage:
    job_id: int
    claim_token: str


class NotAJob(ValueError):
    """A message on a job queue that is not a job message (the reason says why)."""


def read(body) -> JobMessage:
    """The job a message names; NotAJob if the body is not a job message."""
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    if not isinstance(body, bytes) or len(body) > MAX_BODY:
        raise NotAJob(f"not a job message (a body of {len(body) if isinstance(body, bytes) else '?'} bytes)")
    try:
        data = json.loads(body)
    except ValueError:
        raise NotAJob("not a job message (the body is not JSON)") from None
    job_id = data.get("job") if isinstance(data, dict) else None
    token = data.get("claim_token") if isinstance(data, dict) else None
    if (isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1 or not isinstance(token, str)
            or not (1 <= len(token) <= 32) or not token.isalnum() or not token.isascii()):
        raise NotAJob("not a job message (no job id and claim token)")
    return JobMessage(job_id, token)
