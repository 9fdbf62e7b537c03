"""A small HTTP client that tells "never sent" from "sent, no answer".

http.client rather than urllib: connecting and waiting for the answer are
separate steps, so a timeout while connecting (nothing sent, retry freely) is
told apart from a timeout while waiting for the response (outcome unknown).
Errors never carry the URL: a Kavenegar API key lives in the path.
"""
from __future__ import annotations

import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from outbox.channels.errors import OutcomeUnknown, SendFailed


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None


def request(method: str, url: str, *, form: dict | None = None, data: bytes | None = None,
            headers: dict | None = None, timeout: float) -> Response:
    """`form`: sent url-encoded; `data`: sent as it is, with the Content-Type given in `headers`."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    body = urlencode(form).encode() if form is not None else data
    all_headers = {"Accept": "application/json", "User-Agent": "cronbox", **(headers or {})}
    if form is not None:
        all_headers["Content-Type"] = "application/x-www-form-urlencoded"
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout,
                                                 context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        try:
            connection.connect()
        except (OSError, ssl.SSLError) as exc:
            raise SendFailed(f"could not connect to {parts.hostname}: {type(exc).__name__}") from None
        try:
            connection.request(method, path, body=body, headers=all_headers)
            answer = connection.getresponse()
            data = answer.read()
        except (socket.timeout, TimeoutError):
            raise OutcomeUnknown(f"no answer from {parts.hostname} within {timeout:g}s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise OutcomeUnknown(f"connection to {parts.hostname} broke after sending: {type(exc).__name__}") from None
        return Response(answer.status, {k.lower(): v for k, v in answer.getheaders()}, data)
    finally:
        connection.close()


def retry_after(response: Response, default: float) -> float:
    value = response.headers.get("retry-after", "")
    try:
        return max(float(value), 1.0)
    except ValueError:
        return default
