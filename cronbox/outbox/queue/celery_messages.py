"""Celery task messages (Celery's message protocol, version 2) for a queue forwarded with
protocol="celery" (outbox.queue.forward_jobs): the user's own `celery worker -Q <queue>` runs them.

What is sent, per job, through the publisher's py-amqp client (the protocol's bytes are py-amqp's:
a Message with these properties and headers, its body JSON):
- properties: `correlation_id` the task id, `content_type` application/json, `content_encoding`
  utf-8, persistent, priority 0;
- headers: `lang` "py", `task` the job's name (the Celery task's), `id` and `root_id` the task id,
  `parent_id` / `group` / `eta` / `expires` none, `retries` 0, `timelimit` [none, none], `origin`
  "cronbox@<host>", and `argsrepr` / `kwargsrepr` naming the job ("<cronbox job 42>"), never its
  arguments: Celery shows these in its logs and monitors, and a payload may hold PHI;
- body: `[args, kwargs, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]`, the
  job's payload as the task's arguments: a list is its args, a dict its kwargs, anything else one
  positional argument.
The task id is derived from the job's trace id: every publish of one job carries the same id.
Delivery is at least once: a publisher killed between the broker's confirm and the row's ack sends
the task again (same id) once its lease runs out.
"""
from __future__ import annotations

import json
import socket
import uuid

from cronbox.outbox.core.payload import load_payload
from cronbox.outbox.core.sealing import JOBS, is_sealed, open_payload
from cronbox.outbox.amqp.broker import Outgoing

NAMESPACE = uuid.UUID("6b3a1c52-1f0e-4a55-9d3f-2f8a3c5e7d10")  # task ids: uuid5 of the job's trace id
EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def task_id(item) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{item.id}:{item.trace_id}"))


def arguments(payload) -> tuple[list, dict]:
    if isinstance(payload, list):
        return payload, {}
    if isinstance(payload, dict):
        return [], payload
    return ([] if payload is None else [payload]), {}


def message_for(broker_queue: str, item, *, again: bool = False, origin: str | None = None,
                runtime=None) -> Outgoing:
    """The Celery task message of a claimed job (jobstore.ClaimedJob), to the default exchange,
    routed to `broker_queue` (Celery declares its queues on the default exchange too). A sealed row
    (celery_task(sealed=True, celery_protects=...)) is opened here, in memory, under `runtime`'s keys:
    Celery's own signing or encryption protects the message from there."""
    tid = task_id(item)
    args, kwargs = arguments(open_payload(runtime, JOBS, item.handler, item.seal_id, item.payload)
                             if is_sealed(item.payload) else load_payload(item.payload))
    shown = f"<cronbox job {item.id}>"
    headers = {
        "lang": "py", "task": item.handler, "id": tid, "shadow": None, "eta": None, "expires": None,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": tid,
        "parent_id": None, "argsrepr": shown, "kwargsrepr": shown,
        "origin": origin or f"cronbox@{socket.gethostname()}", "ignore_result": False,
        "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
        "x-cronbox-job": item.id, "x-trace-id": item.trace_id,
    }
    body = json.dumps([args, kwargs, EMBED], separators=(",", ":")).encode("utf-8")
    return Outgoing("", broker_queue, body, {
        "correlation_id": tid, "message_id": tid, "content_type": "application/json", "content_encoding": "utf-8",
        "delivery_mode": 2, "priority": 0, "application_headers": headers,
    })
