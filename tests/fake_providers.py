"""A real HTTP server on loopback playing Kavenegar and Twilio, driven by the recipient number.

Numbers ending in: 0000 ok · 1111 invalid number · 4290 throttled (429) · 5000 server error ·
4180 out of credit · 9999 slow (answers after `slow_seconds`, or once `release` is set, but the
message IS sent).
Any answer's body can be made huge, endless or slow (`shape`, `answer`).
"""
from __future__ import annotations

import base64
import itertools
import json
import threading
import time
import tracemalloc
from email.utils import format_datetime
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

API_KEY = "KAVE-SECRET-KEY-123456"
TWILIO_SID, TWILIO_TOKEN = "AC0123456789", "twilio-secret-token"


BIG = 48 * 2**20  # the "huge" answer's promised length
SHAPES = ("huge", "endless", "slow")  # answers a hostile or broken server may give (`shape` below)
SLOW_BYTE = 0.2  # seconds between the "slow" answer's bytes: within a channel's socket timeout (0.5 s and more)
SLOW_PAD = 300  # the "slow" answer's trailing spaces: read whole, it takes a minute at least


def answer(handler: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict | None = None,
           shape: str | None = None) -> int:
    """Send `status` with `data` as its body, or shaped: "huge" (data, then padding to 48 MiB, as a
    Content-Length body), "endless" (data, then chunks of padding for ever, chunked), "slow" (data and
    SLOW_PAD spaces, a byte every SLOW_BYTE s: each read gets a byte within the socket's timeout, the
    whole answer takes a minute, so only a total deadline ends it soon, and a bound on the call tells
    that apart however loaded the machine). Returns the body bytes written before the client hung up
    or the shape ended."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    if shape == "endless":
        handler.send_header("Transfer-Encoding", "chunked")
    else:
        handler.send_header("Content-Length", str(BIG if shape == "huge" else
                                                  len(data) + SLOW_PAD if shape == "slow" else len(data)))
    handler.end_headers()
    written = 0
    pad = b" " * 2**20
    try:
        if shape is None:
            handler.wfile.write(data)
            return len(data)
        if shape == "slow":
            for byte in data + b" " * SLOW_PAD:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                written += 1
                time.sleep(SLOW_BYTE)
            return written
        if shape == "huge":
            handler.wfile.write(data)
            written = len(data)
            while written < BIG:
                part = pad[:BIG - written]
                handler.wfile.write(part)
                written += len(part)
            return written
        started = time.monotonic()
        for part in itertools.chain([data], itertools.repeat(pad)):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            written += len(part)
            if time.monotonic() - started > 60:  # a client that never stops reading: give up
                break
    except OSError:  # the client hung up: what it did not read was never sent
        pass
    return written


def wait_for(condition, seconds: float = 5.0):
    """`condition()` once it is true (the server's thread notices a hang-up a moment later), else falsy."""
    deadline = time.monotonic() + seconds
    while not (result := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return result


def measured(run) -> tuple[int, float]:
    """Run `run()`; the peak of Python memory it allocated (tracemalloc) and the seconds it took."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        run()
        return tracemalloc.get_traced_memory()[1], time.monotonic() - started
    finally:
        tracemalloc.stop()


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the slow answers hit a client that gave up (broken pipe): expected


class LoopbackServer:
    """A real HTTP server on 127.0.0.1 (a free port) serving `self._handler()` on a thread, as a
    context manager; subclasses set their state, then call `super().__init__()`."""

    def __init__(self):
        self.server = QuietServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class Providers(LoopbackServer):
    def __init__(self, slow_seconds: float = 1.5):
        self.slow_seconds = slow_seconds
        self.release = threading.Event()  # ends the slow answers' wait early
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, form)
        self.kavenegar_sent: dict[str, int] = {}  # localid -> messageid
        self.twilio_sent: list[dict] = []
        self.lookups_fail = False
        self.shape: str | None = None  # every answer's body shaped so (fake_providers.answer)
        self.written: list[int] = []  # body bytes written per answer
        self._ids = itertools.count(1000)
        super().__init__()

    def sends(self, provider: str) -> list[dict]:
        marker = "/sms/send.json" if provider == "kavenegar" else "/Messages.json"
        return [form for method, path, form in self.requests if method == "POST" and path.endswith(marker)]

    def _handler(self):
        providers = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: dict, headers: dict | None = None):
                providers.written.append(answer(self, status, json.dumps(body).encode(), headers, providers.shape))

            def do_GET(self):
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                providers.requests.append(("GET", parts.path, query))
                if providers.lookups_fail:
                    return self._reply(503, {"message": "unavailable"})
                if parts.path.endswith("/sms/statuslocalmessageid.json"):
                    message_id = providers.kavenegar_sent.get(query.get("localid"), 0)
                    entry = {"messageid": message_id, "localid": query.get("localid"),
                             "status": 10 if message_id else 100, "statustext": "delivered" if message_id else "invalid"}
                    return self._reply(200, {"return": {"status": 200, "message": "ok"}, "entries": [entry]})
                if parts.path.endswith("/Messages.json"):
                    found = [m for m in providers.twilio_sent if m["to"] == query.get("To")]
                    return self._reply(200, {"messages": found, "page": 0})
                self._reply(404, {"message": "not found"})

            def do_POST(self):
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                providers.requests.append(("POST", parts.path, form))
                if parts.path.endswith("/sms/send.json"):
                    return self._kavenegar(parts.path, form)
                if parts.path.endswith("/Messages.json"):
                    return self._twilio(form)
                self._reply(404, {"message": "not found"})

            def _kavenegar(self, path: str, form: dict):
                if f"/v1/{API_KEY}/" not in path:
                    return self._reply(403, {"return": {"status": 403, "message": "invalid key"}, "entries": None})
                receptor = form.get("receptor", "")
                if receptor.endswith("1111"):
                    return self._reply(411, {"return": {"status": 411, "message": "invalid receptor"}, "entries": None})
                if receptor.endswith("4290"):
                    return self._reply(429, {"return": {"status": 429, "message": "slow down"}, "entries": None},
                                       {"Retry-After": "30"})
                if receptor.endswith("5000"):
                    return self._reply(500, {"return": {"status": 500, "message": "oops"}, "entries": None})
                if receptor.endswith("4180"):
                    return self._reply(418, {"return": {"status": 418, "message": "credit"}, "entries": None})
                message_id = next(providers._ids)
                providers.kavenegar_sent[form.get("localid")] = message_id
                if receptor.endswith("9999"):
                    providers.release.wait(providers.slow_seconds)
                entry = {"messageid": message_id, "status": 1, "receptor": receptor, "cost": 120}
                self._reply(200, {"return": {"status": 200, "message": "ok"}, "entries": [entry]})

            def _twilio(self, form: dict):
                expected = "Basic " + base64.b64encode(f"{TWILIO_SID}:{TWILIO_TOKEN}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    return self._reply(401, {"code": 20003, "message": "Authenticate", "status": 401})
                to = form.get("To", "")
                if to.endswith("1111"):
                    return self._reply(400, {"code": 21211, "message": "invalid To", "status": 400})
                if to.endswith("4290"):
                    return self._reply(429, {"code": 20429, "message": "Too Many Requests", "status": 429},
                                       {"Retry-After": "30"})
                if to.endswith("5000"):
                    return self._reply(500, {"code": 20500, "message": "internal", "status": 500})
                if to.endswith("4180"):
                    return self._reply(400, {"code": 30044, "message": "out of funds", "status": 400})
                message = {"sid": f"SM{next(providers._ids)}", "to": to, "body": form.get("Body"), "status": "queued",
                           "date_created": format_datetime(datetime.now(timezone.utc), usegmt=True)}
                providers.twilio_sent.append(message)
                if to.endswith("9999"):
                    providers.release.wait(providers.slow_seconds)
                self._reply(201, message)

        return Handler


class WebhookReceiver(LoopbackServer):
    """A real HTTP server on loopback receiving webhook alerts: keeps every POST (path, headers, raw body)
    and answers with the next status of `answers` (then 200), after the next delay of `delays` (then 0)."""

    def __init__(self, answers: list[int] | None = None):
        self.answers = list(answers or [])
        self.delays: list[float] = []
        self.shape: str | None = None  # every answer's body shaped so (fake_providers.answer)
        self.written: list[int] = []
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        super().__init__()

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.received.append((self.path, dict(self.headers.items()), body))
                if receiver.delays:
                    time.sleep(receiver.delays.pop(0))
                status = receiver.answers.pop(0) if receiver.answers else 200
                receiver.written.append(answer(self, status, json.dumps({"ok": status < 300}).encode(),
                                               shape=receiver.shape))

        return Handler
