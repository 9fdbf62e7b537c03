"""What the two apps' handlers ran: (app name, handler name, payload), in this process."""
from __future__ import annotations

RAN: list[tuple[str, str, dict]] = []


def note(handler: str, payload: dict) -> None:
    from flask import current_app  # the app context the handler runs in (cronbox.web.hosting)

    RAN.append((current_app.name, handler, payload))
