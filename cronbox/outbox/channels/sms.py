"""SMS drivers: Kavenegar, Twilio, a log driver for development, and a test driver (captured.py).

Each `send(ctx, to, text)` records every attempt and ends in one of the ways
errors.py lists. A timeout is an unknown outcome, never a failure to resend
blindly: the next attempt looks the message up first (Kavenegar by `localid`,
Twilio by recipient, date and body).
"""
from __future__ import annotations

import base64
import hashlib
import logging
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from urllib.parse import quote

from cronbox.outbox.core.errors import PermanentFailure, RetryLater
from cronbox.outbox.queue.pauses import ChannelPaused

from cronbox.outbox.channels import attempts, http
from cronbox.outbox.channels.config import ChannelConfig
from cronbox.outbox.channels.errors import OutcomeUnknown, SendFailed, UnknownAfterLookup

log = logging.getLogger("cronbox")
CHANNEL = "sms"


def driver_for(config: ChannelConfig):
    return {"log": LogSms, "kavenegar": Kavenegar, "twilio": Twilio, "test": TestSms}[config.sms_driver](config)


def _send(ctx, provider: str, to: str, request, classify) -> None:
    """POST, record the attempt, raise what the answer means. A "sending" row is committed first: if
    the job times out or the process dies mid-request, the next attempt knows the outcome is unknown."""
    attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="sending", provider_status=provider)
    try:
        response = request()
    except OutcomeUnknown as exc:
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="unknown", detail=str(exc))
        raise
    except SendFailed as exc:
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="not-sent", detail=str(exc))
        raise
    outcome, provider_status, provider_id, detail, error = classify(response)
    attempts.record(ctx, channel=CHANNEL, recipient=to, outcome=outcome, http_status=response.status,
                    provider_status=provider_status, provider_id=provider_id, detail=detail)
    if error is not None:
        raise error
    log.info("sms sent via %s to=%s key=%s trace=%s provider_id=%s", provider, attempts.mask_recipient(to),
             ctx.idempotency_key, ctx.trace_id, provider_id)


class LogSms:
    """Development driver: logs that a message would go out (masked number, length only)."""

    def __init__(self, config: ChannelConfig):
        self.config = config

    def send(self, ctx, to: str, text: str) -> None:
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="sent", provider_status="log",
                        detail=f"{len(text)} characters")
        log.info("sms (log driver) to=%s chars=%d key=%s trace=%s", attempts.mask_recipient(to), len(text),
                 ctx.idempotency_key, ctx.trace_id)


class TestSms:
    """Test driver: the message is kept in this process for cronbox.testing (captured.py)."""

    def __init__(self, config: ChannelConfig):
        self.config = config

    def send(self, ctx, to: str, text: str) -> None:
        from cronbox.outbox.channels.captured import SENT, Message

        SENT.send(ctx, Message(CHANNEL, to, text))


# ---- Kavenegar ------------------------------------------------------------------

# return.status codes (https://kavenegar.com/rest.html)
KAVENEGAR_PERMANENT = {411: "invalid receptor", 413: "message empty or too long", 414: "too many receptors",
                       422: "invalid characters", 424: "template not found", 501: "test account: owner only"}
KAVENEGAR_PAUSE = {401: "account disabled", 403: "invalid API key", 407: "no access to this method",
                   412: "invalid sender line", 416: "server IP not allowed", 418: "out of credit"}
KAVENEGAR_LATER = {409: "server cannot answer now", 451: "too many requests"}
KAVENEGAR_NOT_DELIVERED = {6, 11, 13, 14, 100}  # failed, undelivered, cancelled, blocked, unknown id


class Kavenegar:
    def __init__(self, config: ChannelConfig):
        self.config = config

    def _url(self, method: str) -> str:
        # The API key is part of the path: this URL must never be logged or put in an error.
        return f"{self.config.kavenegar_url}/v1/{self.config.kavenegar_api_key}/sms/{method}.json"

    def localid(self, ctx) -> str:
        """A number unique to this job across apps sharing the Kavenegar account (numeric, stable)."""
        digest = hashlib.sha256(f"{ctx.settings.database_url}|{ctx.idempotency_key}".encode()).hexdigest()
        return str(int(digest[:13], 16))

    def send(self, ctx, to: str, text: str) -> None:
        if not self.config.kavenegar_api_key or not self.config.sms_sender:
            raise ChannelPaused(CHANNEL, self.config.pause_seconds,
                                "Kavenegar is not configured (CRONBOX_KAVENEGAR_API_KEY, CRONBOX_SMS_SENDER)")
        localid = self.localid(ctx)
        if attempts.unknown_since(attempts.previous(ctx, CHANNEL)) and self._already_sent(ctx, to, localid):
            return
        _send(ctx, "kavenegar", to, lambda: http.request(
            "POST", self._url("send"), timeout=self.config.timeout,
            form={"receptor": to, "sender": self.config.sms_sender, "message": text, "localid": localid},
        ), self._classify)

    def _already_sent(self, ctx, to: str, localid: str) -> bool:
        """After an unknown outcome: did the provider get it? Look the localid up."""
        response = http.request("GET", self._url("statuslocalmessageid") + f"?localid={localid}",
                                timeout=self.config.timeout)
        body = response.json() or {}
        entries = body.get("entries") or []
        entry = entries[0] if entries and isinstance(entries[0], dict) else {}
        message_id = entry.get("messageid") or 0
        found = response.status == 200 and message_id and entry.get("status") not in KAVENEGAR_NOT_DELIVERED
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="found" if found else "not-found",
                        http_status=response.status, provider_status=str(entry.get("status", "")),
                        provider_id=str(message_id) if message_id else None, detail="lookup by localid")
        if response.status != 200:
            raise SendFailed(f"Kavenegar lookup answered HTTP {response.status}")
        return bool(found)

    def _classify(self, response: http.Response):
        body = response.json() or {}
        status = (body.get("return") or {}).get("status", response.status)
        try:
            status = int(status)
        except (TypeError, ValueError):
            status = response.status
        entries = body.get("entries") or []
        entry = entries[0] if entries and isinstance(entries[0], dict) else {}
        if response.status == 200 and status == 200:
            return "sent", str(entry.get("status", "")), str(entry.get("messageid", "")), None, None
        if status in KAVENEGAR_PERMANENT:
            reason = KAVENEGAR_PERMANENT[status]
            return "rejected", str(status), None, reason, PermanentFailure(f"Kavenegar {status}: {reason}")
        if status in KAVENEGAR_PAUSE:
            reason = KAVENEGAR_PAUSE[status]
            return "paused", str(status), None, reason, ChannelPaused(CHANNEL, self.config.pause_seconds,
                                                                      f"Kavenegar {status}: {reason}")
        if status in KAVENEGAR_LATER or response.status == 429:
            reason = KAVENEGAR_LATER.get(status, "too many requests")
            return "retry-later", str(status), None, reason, RetryLater(http.retry_after(response, 60),
                                                                        f"Kavenegar {status}: {reason}")
        return "not-sent", str(status), None, f"HTTP {response.status}", SendFailed(
            f"Kavenegar answered HTTP {response.status} (status {status})")


# ---- Twilio ---------------------------------------------------------------------

TWILIO_PERMANENT = {21211: "invalid To number", 21214: "To number cannot be reached", 21408: "region not enabled",
                    21610: "recipient unsubscribed (STOP)", 21612: "cannot route to this number",
                    21614: "not a mobile number", 21617: "body too long", 21602: "body required"}
TWILIO_PAUSE = {20003: "authentication failed", 20005: "account not active", 21606: "From number not usable",
                21212: "invalid From number", 30044: "account out of funds"}


class Twilio:
    def __init__(self, config: ChannelConfig):
        self.config = config

    def _url(self, query: str = "") -> str:
        return f"{self.config.twilio_url}/2010-04-01/Accounts/{self.config.twilio_sid}/Messages.json{query}"

    def _auth(self) -> dict:
        raw = f"{self.config.twilio_sid}:{self.config.twilio_token}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode()}

    def send(self, ctx, to: str, text: str) -> None:
        if not (self.config.twilio_sid and self.config.twilio_token and self.config.sms_sender):
            raise ChannelPaused(CHANNEL, self.config.pause_seconds, "Twilio is not configured "
                                "(CRONBOX_TWILIO_ACCOUNT_SID, CRONBOX_TWILIO_AUTH_TOKEN, CRONBOX_SMS_SENDER)")
        unknown_since = attempts.unknown_since(attempts.previous(ctx, CHANNEL))
        if unknown_since is not None and self._already_sent(ctx, to, text, unknown_since):
            return
        _send(ctx, "twilio", to, lambda: http.request(
            "POST", self._url(), headers=self._auth(), timeout=self.config.timeout,
            form={"To": to, "From": self.config.sms_sender, "Body": text},
        ), self._classify)

    def _already_sent(self, ctx, to: str, text: str, since: datetime) -> bool:
        """Twilio takes no idempotency key: look for our message by To, date sent and body. If even the
        lookup fails, fail as "outcome unknown" rather than risk sending twice."""
        query = f"?To={quote(to)}&DateSent%3E={since.date().isoformat()}&PageSize=50"
        try:
            response = http.request("GET", self._url(query), headers=self._auth(), timeout=self.config.timeout)
        except (SendFailed, OutcomeUnknown) as exc:
            self._give_up_unknown(ctx, to, str(exc))
        if response.status != 200:
            self._give_up_unknown(ctx, to, f"Twilio lookup answered HTTP {response.status}")
        messages = (response.json() or {}).get("messages") or []
        match = next((m for m in messages if isinstance(m, dict) and m.get("body") == text
                      and _twilio_time(m.get("date_created")) >= since - timedelta(minutes=2)), None)
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="found" if match else "not-found",
                        http_status=response.status, provider_id=match.get("sid") if match else None,
                        detail="lookup by recipient, date and body")
        return match is not None

    def _give_up_unknown(self, ctx, to: str, why: str):
        """Fail as "outcome unknown" (resending could text the patient twice); the job alerts the operator."""
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="lookup-failed", detail=why)
        raise UnknownAfterLookup(
            f"outcome unknown: the message may have been sent and Twilio could not be asked ({why}); not resending",
            recipient=attempts.mask_recipient(to), why=why)

    def _classify(self, response: http.Response):
        body = response.json() or {}
        if response.status in (200, 201):
            return "sent", str(body.get("status", "")), body.get("sid"), None, None
        code = body.get("code")
        try:
            code = int(code)
        except (TypeError, ValueError):
            code = None
        if code in TWILIO_PERMANENT:
            reason = TWILIO_PERMANENT[code]
            return "rejected", str(code), None, reason, PermanentFailure(f"Twilio {code}: {reason}")
        if code in TWILIO_PAUSE or response.status in (401, 403):
            reason = TWILIO_PAUSE.get(code, "not authorised")
            return "paused", str(code or response.status), None, reason, ChannelPaused(
                CHANNEL, self.config.pause_seconds, f"Twilio {code or response.status}: {reason}")
        if response.status == 429 or code == 20429:
            return "retry-later", str(code or 429), None, "too many requests", RetryLater(
                http.retry_after(response, 60), "Twilio: too many requests")
        if 400 <= response.status < 500:
            return "rejected", str(code or response.status), None, f"HTTP {response.status}", PermanentFailure(
                f"Twilio {code or response.status}: request refused")
        return "not-sent", str(code or response.status), None, f"HTTP {response.status}", SendFailed(
            f"Twilio answered HTTP {response.status}")


def _twilio_time(value) -> datetime:
    """Twilio dates are RFC 2822 ("Mon, 30 Nov 2026 12:00:00 +0000"); ours are naive UTC."""
    try:
        return parsedate_to_datetime(value).astimezone(timezone.utc).replace(tzinfo=None)
    except (TypeError, ValueError):
        return datetime.min
