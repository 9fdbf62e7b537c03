"""Who is asking: the client IP as CRONBOX_TRUSTED_PROXIES allows us to believe it.

With N trusted proxies (cPanel's nginx in front of Apache, a CDN), the client
is the N-th address from the right of X-Forwarded-For, as Werkzeug's ProxyFix
reads it; anything further left was written by the client and proves nothing.
With 0 (the default) the header is ignored. Used for the audit trail and,
later, login throttling.
"""
from __future__ import annotations

import ipaddress

from flask import Request


def client_ip(request: Request, trusted_proxies: int) -> str | None:
    remote = request.remote_addr
    if trusted_proxies > 0:
        hops = [part.strip() for part in request.headers.get("X-Forwarded-For", "").split(",") if part.strip()]
        if len(hops) >= trusted_proxies:
            candidate = hops[-trusted_proxies]
            try:
                return str(ipaddress.ip_address(candidate))
            except ValueError:
                return remote
    return remote
