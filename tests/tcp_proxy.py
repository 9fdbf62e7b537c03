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

Threads: one accepting, two per connection pumping bytes. A refused connection is accepted and
closed straight away, so the client sees "Lost connection" during the handshake rather than
waiting for a timeout.
"""
from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
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
            pair = {"muted": False}  # this connection's own mute (mute_on)
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
                if data:
                    sink.sendall(data)
                if budget is not None and self.cut_budget == 0:
                    self.cut_budget = None
                    self.cut()
                    return
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)

    def _downstream(self, source: socket.socket, sink: socket.socket, pair: dict) -> None:
        try:
            while data := source.recv(65536):
                if not (self.muted or pair["muted"]):
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)

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
