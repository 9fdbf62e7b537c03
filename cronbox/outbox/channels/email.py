"""E-mail over SMTP (smtplib): STARTTLS, implicit TLS or plain, with timeouts; or a log driver for
development, or the test driver (captured.py).

SMTP has no idempotency key. Every message carries a Message-ID made from the
job's idempotency key, so if an attempt's outcome is unknown (timeout after
DATA) and the job resends, mail clients see the same message twice at worst
and most collapse it: e-mail is at-least-once.
"""
from __future__ import annotations

import logging
import smtplib
import socket
import ssl
from email.message import EmailMessage
from email.utils import formatdate

from cronbox.outbox.core.errors import PermanentFailure
from cronbox.outbox.queue.pauses import ChannelPaused

from cronbox.outbox.channels import attempts
from cronbox.outbox.channels.config import ChannelConfig
from cronbox.outbox.channels.errors import OutcomeUnknown, SendFailed

log = logging.getLogger("cronbox")
CHANNEL = "mail"


def build_message(config: ChannelConfig, ctx, *, to: str, subject: str, text: str, html: str | None) -> EmailMessage:
    message = EmailMessage()
    message["From"] = config.mail_from
    message["To"] = to
    message["Subject"] = subject
    message["Date"] = formatdate(usegmt=True)
    domain = config.mail_from.rpartition("@")[2] or "cronbox.invalid"
    message["Message-ID"] = f"<{ctx.idempotency_key}@{domain}>"
    message.set_content(text)
    if html:
        message.add_alternative(html, subtype="html")
    return message


def send(config: ChannelConfig, ctx, *, to: str, subject: str, text: str, html: str | None = None) -> None:
    if config.mail_driver == "log":
        _log_only(ctx, to=to, text=text, html=html)
        return
    if config.mail_driver == "test":
        from cronbox.outbox.channels.captured import SENT, Message

        SENT.send(ctx, Message(CHANNEL, to, text, subject=subject, html=html))
        return
    if not config.smtp_host or not config.mail_from:
        raise ChannelPaused(CHANNEL, config.pause_seconds, "SMTP is not configured (CRONBOX_SMTP_HOST, CRONBOX_MAIL_FROM)")
    message = build_message(config, ctx, to=to, subject=subject, text=text, html=html)
    try:
        _deliver(config, message)
    except PermanentFailure as exc:
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="rejected", detail=str(exc))
        raise
    except ChannelPaused as exc:
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="paused", detail=exc.pause_reason)
        raise
    except OutcomeUnknown as exc:
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="unknown", detail=str(exc))
        raise
    except SendFailed as exc:
        attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="not-sent", detail=str(exc))
        raise
    attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="sent", provider_id=message["Message-ID"])
    log.info("mail sent to=%s key=%s trace=%s", attempts.mask_recipient(to), ctx.idempotency_key, ctx.trace_id)


def _log_only(ctx, *, to: str, text: str, html: str | None) -> None:
    """Development driver: no network; records the attempt and logs that a message would go out
    (masked address, sizes only: the subject and body may carry health data)."""
    size = len(text) + len(html or "")
    attempts.record(ctx, channel=CHANNEL, recipient=to, outcome="sent", provider_status="log",
                    detail=f"{size} characters")
    log.info("mail (log driver) to=%s chars=%d key=%s trace=%s", attempts.mask_recipient(to), size,
             ctx.idempotency_key, ctx.trace_id)


def _deliver(config: ChannelConfig, message: EmailMessage) -> None:
    context = ssl.create_default_context()
    try:
        if config.smtp_security == "ssl":
            client = smtplib.SMTP_SSL(config.smtp_host, config.smtp_port, timeout=config.timeout, context=context)
        else:
            client = smtplib.SMTP(config.smtp_host, config.smtp_port, timeout=config.timeout)
    except (OSError, smtplib.SMTPException) as exc:
        raise SendFailed(f"could not connect to the SMTP server: {type(exc).__name__}") from None
    try:
        try:
            if config.smtp_security == "starttls":
                client.starttls(context=context)
            if config.smtp_user:
                client.login(config.smtp_user, config.smtp_password or "")
        except smtplib.SMTPAuthenticationError as exc:
            raise ChannelPaused(CHANNEL, config.pause_seconds, f"SMTP login refused ({exc.smtp_code})") from None
        except smtplib.SMTPNotSupportedError:
            raise ChannelPaused(CHANNEL, config.pause_seconds, "the SMTP server offers no STARTTLS; "
                                "set CRONBOX_SMTP_SECURITY") from None
        except (OSError, smtplib.SMTPException) as exc:
            raise SendFailed(f"SMTP session failed before sending: {type(exc).__name__}") from None
        try:
            client.send_message(message)
        except smtplib.SMTPRecipientsRefused as exc:
            code = min(code for code, _ in exc.recipients.values())
            if code >= 500:
                raise PermanentFailure(f"recipient refused by the SMTP server ({code})") from None
            raise SendFailed(f"recipient deferred by the SMTP server ({code})") from None
        except smtplib.SMTPSenderRefused as exc:
            if exc.smtp_code >= 500:
                raise ChannelPaused(CHANNEL, config.pause_seconds, f"sender refused ({exc.smtp_code})") from None
            raise SendFailed(f"sender deferred ({exc.smtp_code})") from None
        except smtplib.SMTPDataError as exc:
            if exc.smtp_code >= 500:
                raise PermanentFailure(f"message refused by the SMTP server ({exc.smtp_code})") from None
            raise SendFailed(f"message deferred ({exc.smtp_code})") from None
        except (socket.timeout, TimeoutError, smtplib.SMTPServerDisconnected, OSError) as exc:
            raise OutcomeUnknown(f"SMTP connection broke while sending: {type(exc).__name__}") from None
    finally:
        try:
            client.quit()
        except (OSError, smtplib.SMTPException):
            client.close()
