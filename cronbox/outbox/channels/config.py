"""Channel settings, read from the run's Settings (.env, then the environment).

| setting | default | meaning |
| CRONBOX_SMS_DRIVER | log | log, kavenegar, twilio, or test (kept in memory for cronbox.testing: captured.py) |
| CRONBOX_SMS_SENDER | - | Kavenegar line number / Twilio From number |
| CRONBOX_KAVENEGAR_API_KEY, CRONBOX_KAVENEGAR_URL | -, https://api.kavenegar.com | |
| CRONBOX_TWILIO_ACCOUNT_SID, CRONBOX_TWILIO_AUTH_TOKEN, CRONBOX_TWILIO_URL | -, -, https://api.twilio.com | |
| CRONBOX_SMS_RATE, CRONBOX_MAIL_RATE | - | shared rate limits, e.g. 5/s, 100/m |
| CRONBOX_CHANNEL_TIMEOUT | 10 | seconds for each network step |
| CRONBOX_CHANNEL_PAUSE | 900 | seconds a channel waits after "out of credit" / "bad credentials" |
| CRONBOX_MAIL_DRIVER | smtp | smtp, log (development: nothing is sent) or test (captured.py) |
| CRONBOX_SMTP_HOST, _PORT, _USER, _PASSWORD, _SECURITY | -, 587, -, -, starttls | security: starttls, ssl or none |
| CRONBOX_MAIL_FROM | - | From address |
| CRONBOX_ADMIN_PHONE, CRONBOX_ADMIN_EMAIL | - | where admin alerts go |
| CRONBOX_ALERT_WEBHOOK_URL, CRONBOX_ALERT_WEBHOOK_SECRET | - | admin alerts as a signed POST (webhook.py); https, http only to loopback; both or neither |
| CRONBOX_WEBHOOK_DRIVER | http | http, or test (the alert is kept in memory, not posted: captured.py) |
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.queue.ratelimit import RateLimit

SMS_DRIVERS = ("log", "kavenegar", "twilio", "test")
MAIL_DRIVERS = ("smtp", "log", "test")
WEBHOOK_DRIVERS = ("http", "test")
SMTP_SECURITY = ("starttls", "ssl", "none")


@dataclass(frozen=True)
class ChannelConfig:
    sms_driver: str
    sms_sender: str | None
    kavenegar_api_key: str | None
    kavenegar_url: str
    twilio_sid: str | None
    twilio_token: str | None
    twilio_url: str
    sms_rate: RateLimit | None
    mail_rate: RateLimit | None
    timeout: float
    pause_seconds: float
    mail_driver: str
    smtp_host: str | None
    smtp_port: int
    smtp_user: str | None
    smtp_password: str | None
    smtp_security: str
    mail_from: str | None
    admin_phone: str | None
    admin_email: str | None
    webhook_url: str | None = None
    webhook_secret: str | None = field(default=None, repr=False)  # never in a repr, a log or an error
    webhook_driver: str = "http"


def channel_config(settings) -> ChannelConfig:
    """Parsed once per Settings object (kept on it: Settings is frozen, so it cannot change under us)."""
    cached = settings.__dict__.get("_channel_config")
    if cached is None:
        cached = _parse(settings)
        object.__setattr__(settings, "_channel_config", cached)
    return cached


def _parse(settings) -> ChannelConfig:
    get = settings.get
    driver = (get("CRONBOX_SMS_DRIVER") or "log").lower()
    if driver not in SMS_DRIVERS:
        raise SettingsError(f"CRONBOX_SMS_DRIVER={driver!r} is not one of {', '.join(SMS_DRIVERS)}")
    # No SMTP host means development (or mail not set up yet): log instead of pausing the channel on
    # every job. Naming the driver explicitly still wins, so production can insist on smtp.
    # smtp unless log is asked for: a production app that forgot its SMTP host must see a paused channel
    # and an alert, not mail that quietly went nowhere.
    mail_driver = (get("CRONBOX_MAIL_DRIVER") or "smtp").lower()
    if mail_driver not in MAIL_DRIVERS:
        raise SettingsError(f"CRONBOX_MAIL_DRIVER={mail_driver!r} is not one of {', '.join(MAIL_DRIVERS)}")
    webhook_driver = (get("CRONBOX_WEBHOOK_DRIVER") or "http").lower()
    if webhook_driver not in WEBHOOK_DRIVERS:
        raise SettingsError(f"CRONBOX_WEBHOOK_DRIVER={webhook_driver!r} is not one of {', '.join(WEBHOOK_DRIVERS)}")
    security = (get("CRONBOX_SMTP_SECURITY") or "starttls").lower()
    if security not in SMTP_SECURITY:
        raise SettingsError(f"CRONBOX_SMTP_SECURITY={security!r} is not one of {', '.join(SMTP_SECURITY)}")
    return ChannelConfig(
        sms_driver=driver,
        sms_sender=get("CRONBOX_SMS_SENDER"),
        kavenegar_api_key=get("CRONBOX_KAVENEGAR_API_KEY"),
        kavenegar_url=(get("CRONBOX_KAVENEGAR_URL") or "https://api.kavenegar.com").rstrip("/"),
        twilio_sid=get("CRONBOX_TWILIO_ACCOUNT_SID"),
        twilio_token=get("CRONBOX_TWILIO_AUTH_TOKEN"),
        twilio_url=(get("CRONBOX_TWILIO_URL") or "https://api.twilio.com").rstrip("/"),
        sms_rate=_rate(get, "CRONBOX_SMS_RATE", "channel:sms"),
        mail_rate=_rate(get, "CRONBOX_MAIL_RATE", "channel:mail"),
        timeout=settings.number("CRONBOX_CHANNEL_TIMEOUT", 10.0, float, above=0),
        pause_seconds=settings.number("CRONBOX_CHANNEL_PAUSE", 900.0, float, above=0),
        mail_driver=mail_driver,
        smtp_host=get("CRONBOX_SMTP_HOST"),
        smtp_port=settings.number("CRONBOX_SMTP_PORT", 465 if security == "ssl" else 587, int, minimum=1),
        smtp_user=get("CRONBOX_SMTP_USER"),
        smtp_password=get("CRONBOX_SMTP_PASSWORD"),
        smtp_security=security,
        mail_from=get("CRONBOX_MAIL_FROM"),
        admin_phone=get("CRONBOX_ADMIN_PHONE"),
        admin_email=get("CRONBOX_ADMIN_EMAIL"),
        webhook_url=_webhook_url(get),
        webhook_secret=get("CRONBOX_ALERT_WEBHOOK_SECRET"),
        webhook_driver=webhook_driver,
    )


def _webhook_url(get) -> str | None:
    url, secret = get("CRONBOX_ALERT_WEBHOOK_URL"), get("CRONBOX_ALERT_WEBHOOK_SECRET")
    if bool(url) != bool(secret):
        raise SettingsError("set CRONBOX_ALERT_WEBHOOK_URL and CRONBOX_ALERT_WEBHOOK_SECRET together "
                            "(alerts are never posted unsigned)")
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise SettingsError("CRONBOX_ALERT_WEBHOOK_URL must be an https:// URL")
    # An alert must not cross a network in clear; http:// is for a receiver on this machine (and the tests).
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise SettingsError("CRONBOX_ALERT_WEBHOOK_URL must use https:// (http:// only to 127.0.0.1, ::1 or localhost)")
    return url


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _rate(get, name: str, bucket: str) -> RateLimit | None:
    spec = get(name)
    if spec is None:
        return None
    try:
        return RateLimit.parse(spec, bucket=bucket)
    except Exception:
        raise SettingsError(f"{name}={spec!r} must look like 5/s, 100/m or 1000/h") from None

