"""A small HTTP client that tells "never sent" from "sent, no answer".

http.client rather than urllib: connecting and waiting for the answer are
separate steps, so a timeout while connecting (nothing sent, retry freely) is
told apart from a timeout while waiting for the response (outcome unknown).
Errors never carry the URL: a Kavenegar API key lives in the path.

An answer's body is read up to MAX_BODY bytes and for at most `timeout` seconds
after its headers, whatever the server sends (48 MiB, an endless chunked body,
one byte a second): a provider's answer that matters is a few hundred bytes of
JSON, and a tick has 64 MB. The status code is kept however the body ends; a
body cut short is `truncated`, and its JSON simply unreadable (`json()` None).
"""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from cronbox.outbox.channels.errors import OutcomeUnknown, SendFailed

MAX_BODY = 64 * 1024  # bytes of an answer's body read at most

@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool = False  # the body reached MAX_BODY, was slower than the timeout, or broke off

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
        except (socket.timeout, TimeoutError):
            raise OutcomeUnknown(f"no answer from {parts.hostname} within {timeout:g}s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise OutcomeUnknown(f"connection to {parts.hostname} broke after sending: {type(exc).__name__}") from None
        data, truncated = _bounded_body(answer, timeout)
        return Response(answer.status, {k.lower(): v for k, v in answer.getheaders()}, data, truncated)
    finally:
        connection.close()  # an unread rest of the body is dropped with the connection


def _bounded_body(answer: http.client.HTTPResponse, timeout: float) -> tuple[bytes, bool]:
    """At most MAX_BODY bytes of the body, read for at most `timeout` seconds; and whether it was cut.
    A body that breaks off after the status line leaves the status as the answer (the server did
    answer), so its error is not raised."""
    deadline = time.monotonic() + timeout
    parts, size = [], 0
    try:
        while size < MAX_BODY:
            if time.monotonic() > deadline:
                return b"".join(parts), True
            part = answer.read1(MAX_BODY - size)
            if not part:
                return b"".join(parts), False
            parts.append(part)
            size += len(part)
        return b"".join(parts), True  # a body of exactly MAX_BODY counts as cut too: nothing reads past it
    except (OSError, http.client.HTTPException):
        return b"".join(parts), True


def retry_after(response: Response, default: float) -> float:
    value = response.headers.get("retry-after", "")
    try:
        return max(float(value), 1.0)
    except ValueError:
        return default
