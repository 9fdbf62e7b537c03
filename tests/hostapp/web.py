"""The host's own top-level `web` module (cronbox must not shadow it)."""
SIGNATURE = "clinic-web"


def receipt_text(appointment_id: int, source: str) -> str:
    return f"{SIGNATURE}: appointment {appointment_id} paid ({source})"
