"""A loopback TCP proxy the fault tests put between cronbox and MariaDB, so they can cut the database
connection at a chosen moment without touching the shared server.

    with TcpProxy(3306) as proxy:       # listens on 127.0.0.1:<proxy.port>
        proxy.cut()                     # every open connection dies (both sockets shut down)
        proxy.refuse()                  # new connections are closed at once (as if the server were gone)
        proxy.accept()                  # normal service again

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
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

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


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
