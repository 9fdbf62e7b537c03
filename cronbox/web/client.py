"""Who is asking, and over what: the client IP and HTTPS as CRONBOX_TRUSTED_PROXIES allows us to believe them.

With N trusted proxies (cPanel's nginx in front of Apache, a CDN), the client
is the N-th address from the right of X-Forwarded-For, and the scheme the N-th
value from the right of X-Forwarded-Proto, as Werkzeug's ProxyFix reads them;
anything further left was written by the client and proves nothing. With 0
(the default) the headers are ignored. Read here, per request, rather than by
wrapping the app in ProxyFix: cronbox must not change what the host's own
routes see as `remote_addr` or `scheme`. Used for the audit trail, login
throttling and the console cookie's Secure flag.
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from flask import Request

from cronbox.storage import audit


def _forwarded(request: Request, header: str, trusted_proxies: int) -> str | None:
    """The value the outermost trusted proxy wrote into `header`, or None."""
    if trusted_proxies <= 0:
        return None
    hops = [part.strip() for part in request.headers.get(header, "").split(",") if part.strip()]
    return hops[-trusted_proxies] if len(hops) >= trusted_proxies else None


def client_ip(request: Request, trusted_proxies: int) -> str | None:
    candidate = _forwarded(request, "X-Forwarded-For", trusted_proxies)
    if candidate is not None:
        try:
            return str(ipaddress.ip_address(candidate))
        except ValueError:
            pass
    return request.remote_addr


def audit_client(request: Request, trusted_proxies: int) -> audit.Client:
    """Who the audit trail names for `request`: its client IP as far as the proxies are trusted, and its
    User-Agent."""
    return audit.Client(client_ip(request, trusted_proxies), request.headers.get("User-Agent"))


def is_https(request: Request, trusted_proxies: int) -> bool:
    """Whether the browser's request came over HTTPS: the trusted proxy's word, else the connection's."""
    scheme = _forwarded(request, "X-Forwarded-Proto", trusted_proxies)
    return (scheme or request.scheme).lower() == "https"


def referrer_refusal(request: Request, trusted_proxies: int) -> str | None:
    """Over HTTPS, why the Referer does not prove a form came from this host (as Flask-WTF's strict mode
    asks: a page of another origin on the same site cannot post with a token it has read); else None."""
    if not is_https(request, trusted_proxies):
        return None
    referrer = request.referrer
    if not referrer:
        return "The referrer header is missing."
    parts = urlsplit(referrer)
    if parts.scheme != "https" or parts.netloc.lower() != request.host.lower():
        return "The referrer does not match the host."
    return None
