"""A loopback TCP proxy the fault tests put between cronbox and MariaDB, so they can cut the database
connection at a chosen moment without touching the shared server.

    with TcpProxy(3306) as proxy:       # listens on 127.0.0.1:<proxy.port>
        proxy.cut()                     # every open connection dies (both sockets shut down)
        proxy.refuse()                  # new connections are closed at once (as if the server were gone)
        proxy.accept()                  # normal service again
        proxy.mute()                    # the server's bytes stop reaching the client; the client's still
                                        # reach the server (an AMQP broker that takes a batch and never
                                        # confirms it); proxy.unmute() undoes it
        proxy.mute_on(b"...")           # mute each connection once its client sends these bytes (e.g. the
                                        # start of a basic.publish); unmute() stops it for new connections
        proxy.cut_after(n)              # cut every connection once the client sent n more bytes on it,
                                        # passing exactly n (a connection cut in the middle of a batch)

With `amqp=True` the proxy reads the AMQP frames going each way (the server's are passed on whole,
frame by frame, so a frame of the proxy's own can go between two of them), and can play a broker
under a resource alarm without setting one on the shared RabbitMQ:
        proxy.block()                   # send connection.blocked to every open client
        proxy.unblock()                 # and connection.unblocked
        proxy.block_new = True          # each new connection is blocked once its channel is in confirm
                                        # mode (the client sent confirm.select), as a broker in alarm would
        proxy.block_after(n)            # block each connection once its client sent n basic.publish
        proxy.publishes                 # basic.publish frames the clients sent, all connections
        proxy.publishes_while_blocked   # of those, the ones sent after the proxy blocked their
                                        # connection and before it unblocked it
        proxy.closes_passed             # the server's connection.close frames passed on to their
                                        # clients (written to the client's socket: the client has it)

Threads: one accepting, two per connection pumping bytes. A refused connection is accepted and
closed straight away, so the client sees "Lost connection" during the handshake rather than
waiting for a timeout.
"""
from __future__ import annotations

import socket
import struct
import threading

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"  # what an AMQP 0-9-1 client sends first, before any frame
BASIC_PUBLISH, CONFIRM_SELECT, CONNECTION_CLOSE = (60, 40), (85, 10), (10, 50)


def method_frame(class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    """An AMQP method frame on channel 0 (AMQP 0-9-1 section 4.2.3)."""
    payload = struct.pack(">HH", class_id, method_id) + arguments
    return struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"


def connection_blocked(reason: str = "low on memory") -> bytes:
    """RabbitMQ's connection.blocked (class 10, method 60, a short-string reason)."""
    data = reason.encode()
    return method_frame(10, 60, bytes((len(data),)) + data)


CONNECTION_UNBLOCKED = method_frame(10, 61)


class Frames:
    """Cuts a byte stream into whole AMQP frames (type, channel, size, payload, frame-end)."""

    def __init__(self, *, skip: bytes = b""):
        self.buffer = bytearray()
        self.skip = skip  # a prefix that is not a frame (the client's protocol header)

    def feed(self, data: bytes) -> list[tuple[int, bytes, bytes]]:
        """The frames `data` completes: (type, payload, the frame's bytes as received)."""
        self.buffer += data
        if self.skip:
            if len(self.buffer) < len(self.skip):
                return []
            del self.buffer[:len(self.skip)]
            self.skip = b""
        out = []
        while len(self.buffer) >= 7:
            kind, _channel, size = struct.unpack_from(">BHI", self.buffer)
            if len(self.buffer) < 8 + size:
                break
            raw = bytes(self.buffer[:8 + size])
            del self.buffer[:8 + size]
            out.append((kind, raw[7:7 + size], raw))
        return out


def method_of(kind: int, payload: bytes) -> tuple[int, int] | None:
    return struct.unpack_from(">HH", payload) if kind == 1 and len(payload) >= 4 else None


class TcpProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1", amqp: bool = False):
        self.target = (target_host, target_port)
        self.amqp = amqp
        self.block_new = False
        self.block_after_publishes: int | None = None
        self.publishes = 0
        self.publishes_while_blocked = 0
        self.closes_passed = 0
        self._links: list[dict] = []  # per connection (amqp): its client socket, send lock, state
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.refusing = False
        self.accepted = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.muted = False
        self.mute_marker: bytes | None = None
        self.cut_budget: int | None = None  # client bytes still passed before the cut
        self.upstream_bytes = 0  # client -> server, all connections
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self, database_url: str) -> str:
        """`database_url` (a MariaDB URL) pointed at this proxy."""
        from sqlalchemy.engine import make_url

        return make_url(database_url).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def _serve(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing or self._closed:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self.accepted += 1
                self._pairs.append((client, server))
            pair = {"muted": False, "client": client, "lock": threading.Lock(), "blocked": False, "publishes": 0,
                    "upstream": Frames(skip=PROTOCOL_HEADER), "downstream": Frames()}  # mute: its own (mute_on)
            if self.amqp:
                # A frame of the proxy's own must reach the client at once, as RabbitMQ's do (it sets
                # TCP_NODELAY): Nagle would hold it back until the client acknowledged earlier data.
                for sock in (client, server):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with self._lock:
                    self._links.append(pair)
            threading.Thread(target=self._upstream, args=(client, server, pair), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, pair), daemon=True).start()

    def _upstream(self, source: socket.socket, sink: socket.socket, pair: dict) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    if self.mute_marker is not None and self.mute_marker in data:
                        pair["muted"] = True
                    budget = self.cut_budget
                    if budget is not None:
                        data = data[:budget]
                        self.cut_budget = budget - len(data)
                    self.upstream_bytes += len(data)
                if data and self.amqp:
                    self._client_frames(pair, data)
                if data:
                    sink.sendall(data)
                if budget is not None and self.cut_budget == 0:
                    self.cut_budget = None
                    self._cut_after_passing(source, sink, pair)
                    return
        except OSError:
            pass
        finally:
            _close(source)
            if not pair.get("draining"):
                _close(sink)

    def _cut_after_passing(self, client: socket.socket, server: socket.socket, pair: dict) -> None:
        """The client's connection dies now; the server gets every byte passed, then an orderly end of
        stream. Closing the server's socket at once would send an RST if the server had answered
        something not yet read here, and an RST makes the server's kernel drop what the server had
        not read yet: the bytes "passed" would never have arrived (seen under load)."""
        with self._lock:
            others = [p for p in self._pairs if p[0] is not client]
            self._pairs = []
        for other_client, other_server in others:  # every other connection open now dies too, first: a
            _close(other_client)                   # client reconnecting after this cut must not be cut
            _close(other_server)
        pair["draining"] = True  # _downstream reads the server to its end, then closes it
        try:
            server.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        _close(client)

    def _downstream(self, source: socket.socket, sink: socket.socket, pair: dict) -> None:
        try:
            while data := source.recv(65536):
                if pair.get("draining"):
                    continue  # cut after passing: read to the server's end, pass nothing
                if not self.amqp:
                    if not (self.muted or pair["muted"]):
                        sink.sendall(data)
                    continue
                for kind, payload, raw in pair["downstream"].feed(data):
                    with pair["lock"]:  # whole frames: the proxy's own go between them
                        if not (self.muted or pair["muted"]):
                            sink.sendall(raw)
                            if method_of(kind, payload) == CONNECTION_CLOSE:
                                with self._lock:
                                    self.closes_passed += 1
        except OSError:
            if pair.get("draining"):
                self._drain(source)
        finally:
            _close(source)
            _close(sink)

    @staticmethod
    def _drain(server: socket.socket) -> None:
        """Read what the server still sends until it closes its side (or 10 s): then ours closes cleanly."""
        server.settimeout(10)
        try:
            while server.recv(65536):
                pass
        except OSError:
            pass

    def _client_frames(self, pair: dict, data: bytes) -> None:
        for kind, payload, _raw in pair["upstream"].feed(data):
            method = method_of(kind, payload)
            if method == BASIC_PUBLISH:
                with self._lock:
                    self.publishes += 1
                    pair["publishes"] += 1
                    if pair["blocked"]:
                        self.publishes_while_blocked += 1
                if self.block_after_publishes is not None and pair["publishes"] == self.block_after_publishes:
                    self._send(pair, connection_blocked(), blocked=True)
            elif method == CONFIRM_SELECT and self.block_new:
                self._send(pair, connection_blocked(), blocked=True)

    def _send(self, pair: dict, frame: bytes, *, blocked: bool) -> None:
        """`frame` to the client, between two of the server's frames."""
        with pair["lock"]:
            pair["blocked"] = blocked  # before the client can see it: what it sends from now on counts
            try:
                pair["client"].sendall(frame)
            except OSError:
                pass

    def block(self) -> int:
        """connection.blocked to every open client (amqp=True); returns how many."""
        return self._send_all(connection_blocked(), blocked=True)

    def unblock(self) -> int:
        return self._send_all(CONNECTION_UNBLOCKED, blocked=False)

    def block_after(self, publishes: int) -> None:
        self.block_after_publishes = publishes

    def _send_all(self, frame: bytes, *, blocked: bool) -> int:
        with self._lock:
            links = [p for p in self._links if p["client"].fileno() != -1]
        for pair in links:
            self._send(pair, frame, blocked=blocked)
        return len(links)

    @property
    def open_connections(self) -> int:
        with self._lock:
            self._pairs = [p for p in self._pairs if p[0].fileno() != -1]
            return len(self._pairs)

    def cut(self) -> int:
        """Kill every connection now open; returns how many there were."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, server in pairs:
            _close(client)
            _close(server)
        return len(pairs)

    def mute(self) -> None:
        self.muted = True

    def unmute(self) -> None:
        self.muted, self.mute_marker = False, None

    def mute_on(self, marker: bytes) -> None:
        self.mute_marker = marker

    def cut_after(self, n: int) -> None:
        with self._lock:
            self.cut_budget = n

    def refuse(self) -> None:
        self.refusing = True

    def accept(self) -> None:
        self.refusing = False

    def close(self) -> None:
        self._closed = True
        _close(self.listener)
        self.cut()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
