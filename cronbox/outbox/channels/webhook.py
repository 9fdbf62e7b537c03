"""Admin alerts as a signed HTTPS POST (CRONBOX_ALERT_WEBHOOK_URL), beside the e-mail and SMS ones.

The body is JSON: {"id", "check", "status", "message", "time", "host", "recovery"}. `id` is the job's
idempotency key: an attempt whose answer never came (a timeout) is sent again with the same id, so
a receiver that keeps the ids it has seen acts once (webhooks are at-least-once).

Signature, as Stripe's: `X-Cronbox-Signature: t=<unix seconds>,v1=<hex>` where hex is
HMAC-SHA256(CRONBOX_ALERT_WEBHOOK_SECRET, "<t>." + raw body). The receiver recomputes it over the raw
bytes it got, compares in constant time, and refuses a `t` more than a few minutes old (a replay).
README "Webhook alerts" has the receiver's code.

The secret and the URL's path and query (chat services put their token there) are never logged
or recorded: an attempt row names the scheme and host only.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
from datetime import datetime
from urllib.parse import urlsplit

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import PermanentFailure, RetryLater
from cronbox.outbox.queue.pauses import ChannelPaused

from cronbox.outbox.channels import attempts, http
from cronbox.outbox.channels.config import ChannelConfig
from cronbox.outbox.channels.errors import OutcomeUnknown, SendFailed

log = logging.getLogger("cronbox")
CHANNEL = "webhook"
HEADER = "X-Cronbox-Signature"
EPOCH = datetime(1970, 1, 1)
# Answers that say the endpoint or our secret is wrong: retrying cannot help until the operator fixes it.
PAUSE_STATUSES = {401: "signature or credentials refused", 403: "forbidden", 404: "no such endpoint",
                  410: "endpoint gone"}


def where(url: str) -> str:
    """What logs and attempt rows may show of the URL: scheme, host and port."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def body_of(payload: dict, idempotency_key: str) -> bytes:
    """The exact bytes posted (and signed): the alert's fields with its id, compact JSON, UTF-8."""
    return json.dumps({"id": idempotency_key, **payload}, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def send(config: ChannelConfig, ctx, payload: dict) -> None:
    url, secret = config.webhook_url, config.webhook_secret
    if not url or not secret:
        raise PermanentFailure("no webhook configured (CRONBOX_ALERT_WEBHOOK_URL, CRONBOX_ALERT_WEBHOOK_SECRET)")
    target = where(url)
    body = body_of(payload, ctx.idempotency_key)
    if config.webhook_driver == "test":  # kept in this process for cronbox.testing (captured.py), not posted
        from cronbox.outbox.channels.captured import SENT, Message

        SENT.send(ctx, Message(CHANNEL, target, body.decode("utf-8")))
        return
    timestamp = int((clock.utcnow() - EPOCH).total_seconds())  # clock.utcnow() is naive UTC (frozen in tests)
    headers = {HEADER: sign(secret, timestamp, body), "Content-Type": "application/json"}
    attempts.record(ctx, channel=CHANNEL, recipient=target, outcome="sending")
    try:
        response = http.request("POST", url, data=body, headers=headers, timeout=config.timeout)
    except OutcomeUnknown as exc:
        # Sent again with the same id: the receiver's dedupe makes it once.
        attempts.record(ctx, channel=CHANNEL, recipient=target, outcome="unknown", detail=str(exc))
        raise SendFailed(str(exc)) from None
    except SendFailed as exc:
        attempts.record(ctx, channel=CHANNEL, recipient=target, outcome="not-sent", detail=str(exc))
        raise
    status = response.status
    if 200 <= status < 300:
        attempts.record(ctx, channel=CHANNEL, recipient=target, outcome="sent", http_status=status)
        log.info("webhook alert sent to=%s status=%d key=%s trace=%s", target, status, ctx.idempotency_key,
                 ctx.trace_id)
        return
    if status == 429:
        attempts.record(ctx, channel=CHANNEL, recipient=target, outcome="retry-later", http_status=status)
        raise RetryLater(http.retry_after(response, 60), "webhook receiver: too many requests")
    if status in PAUSE_STATUSES:
        attempts.record(ctx, channel=CHANNEL, recipient=target, outcome="paused", http_status=status,
                        detail=PAUSE_STATUSES[status])
        raise ChannelPaused(CHANNEL, config.pause_seconds, f"webhook receiver answered HTTP {status}: "
                            f"{PAUSE_STATUSES[status]} (check CRONBOX_ALERT_WEBHOOK_URL and _SECRET)")
    if 400 <= status < 500 and status != 408:
        attempts.record(ctx, channel=CHANNEL, recipient=target, outcome="rejected", http_status=status)
        raise PermanentFailure(f"webhook receiver refused the alert (HTTP {status})")
    attempts.record(ctx, channel=CHANNEL, recipient=target, outcome="not-sent", http_status=status)
    raise SendFailed(f"webhook receiver answered HTTP {status}")

