"""Delivery channels run as jobs: SMS (Kavenegar, Twilio, log), e-mail (SMTP), in-app notifications.

Dispatch from your code or a consumer, inside your transaction:

    from cronbox.outbox.channels import send_sms, send_email, notify
    send_sms.dispatch(session, {"to": "+989121234567", "text": "Your code is 4711"})

Importing this package registers the jobs `cronbox.sms` (queue "sms"),
`cronbox.email` (queue "mail"), `cronbox.notify` (queue "notifications") and `cronbox.webhook`
(queue "webhook": admin alerts posted to CRONBOX_ALERT_WEBHOOK_URL).
Numbers, addresses and message bodies never reach the logs in clear.
"""
from cronbox.outbox.channels.jobs import admin_alert, notify, send_email, send_sms, send_webhook

__all__ = ["admin_alert", "notify", "send_email", "send_sms", "send_webhook"]
