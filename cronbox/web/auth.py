"""Bearer tokens for machine endpoints (/health detail, /cron/tick, uploads).

Only the Authorization header is read, never the query string (URLs land in
access logs), and the comparison takes the same time whatever the input.
"""
from __future__ import annotations

import hmac

from flask import request


def bearer_matches(expected: str | None) -> bool:
    if not expected:
        return False
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return hmac.compare_digest(token.strip().encode("utf-8"), expected.encode("utf-8"))
