"""The console's operator, without Flask: password and setup token files, sessions, the action log.

Here rather than in cronbox/ops/ because the `ops` commands use them too, and
imports go outbox <- storage <- cron <- web (docs/architecture.md).
"""
