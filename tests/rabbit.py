"""The real RabbitMQ for the forwarding tests: one vhost per test session, names unique per test.

The broker at 127.0.0.1:5672 (guest/guest) is shared with everything else on the machine, so a
session makes its own vhost (rabbitmqctl add_vhost) and deletes it at the end, with every exchange
and queue in it; faults never stop the broker: a TcpProxy cuts connections, `rabbitmqctl
close_connection` closes them from the broker's side. Without a broker the tests skip, loudly;
with CRONBOX_REQUIRE_AMQP=1 (as in CI) that is a failure.
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
from urllib.parse import quote

import amqp
import pytest

HOST, PORT = "127.0.0.1", 5672
REQUIRE_AMQP = os.environ.get("CRONBOX_REQUIRE_AMQP") == "1"


def _unavailable(reason: str):
    if REQUIRE_AMQP:
        pytest.fail(f"RabbitMQ required (CRONBOX_REQUIRE_AMQP=1) but {reason}")
    pytest.skip(f"RabbitMQ tests skipped: {reason}")


def rabbitmqctl(*args: str) -> str:
    done = subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()[:300]}")
    return done.stdout


def url(vhost: str, port: int = PORT) -> str:
    return f"amqp://guest:guest@{HOST}:{port}/{quote(vhost, safe='')}"


@pytest.fixture(scope="session")
def amqp_vhost():
    try:
        socket.create_connection((HOST, PORT), timeout=2).close()
    except OSError as exc:
        _unavailable(f"nothing listens on {HOST}:{PORT} ({exc}); start it with `rabbitmq-server -detached`")
    name = f"cronbox_test_{secrets.token_hex(4)}"
    try:
        rabbitmqctl("add_vhost", name)
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    except (OSError, RuntimeError) as exc:
        _unavailable(f"could not make a test vhost: {exc}")
    yield name
    rabbitmqctl("delete_vhost", name)


class Rabbit:
    """A test's view of its vhost: declare an exchange with a queue bound to it, read what arrived."""

    def __init__(self, vhost: str):
        self.vhost = vhost
        self.url = url(vhost)
        self.prefix = f"t{secrets.token_hex(4)}"
        self.connection = amqp.Connection(f"{HOST}:{PORT}", virtual_host=vhost, connect_timeout=5)
        self.connection.connect()
        self.channel = self.connection.channel()
        self.exchanges: list[str] = []
        self.queues: list[str] = []

    def name(self, what: str) -> str:
        return f"{self.prefix}.{what}"

    def exchange(self, what: str = "x") -> str:
        name = self.name(what)
        self.channel.exchange_declare(name, "topic", durable=True, auto_delete=False)
        self.exchanges.append(name)
        return name

    def queue(self, exchange: str, binding: str = "#", what: str = "q") -> str:
        name = self.name(what)
        self.channel.queue_declare(name, durable=True, auto_delete=False)
        self.channel.queue_bind(name, exchange, binding)
        self.queues.append(name)
        return name

    def take(self, queue: str) -> list[amqp.Message]:
        """Everything in `queue` now, in queue order (acked: gone from the queue)."""
        out = []
        while True:
            message = self.channel.basic_get(queue, no_ack=True)
            if message is None:
                return out
            out.append(message)

    def state(self, queue: str) -> tuple[int, int] | None:
        """(messages ready, consumers) of `queue` now, by a passive declare on a channel of its own (a
        NotFound closes the channel); None while the queue does not exist."""
        channel = self.connection.channel()
        try:
            declared = channel.queue_declare(queue, passive=True)
            return declared.message_count, declared.consumer_count
        except amqp.exceptions.NotFound:
            return None
        finally:
            if channel.is_open:
                channel.close()

    def close_cronbox_connections(self, name: str = "cronbox relay") -> int:
        """Close, from the broker's side, every connection cronbox's relay (or the one named `name`:
        "cronbox consumer") has open in this vhost."""
        rows = rabbitmqctl("list_connections", "-q", "--no-table-headers", "pid", "vhost", "client_properties")
        closed = 0
        for line in rows.splitlines():
            pid, _, rest = line.partition("\t")
            vhost, _, props = rest.partition("\t")
            if vhost == self.vhost and name in props:
                rabbitmqctl("close_connection", pid, "closed by the test")
                closed += 1
        return closed

    def cleanup(self) -> None:
        for queue in self.queues:
            self.channel.queue_delete(queue)
        for exchange in self.exchanges:
            self.channel.exchange_delete(exchange)
        self.connection.close()


@pytest.fixture
def rabbit(amqp_vhost):
    broker = Rabbit(amqp_vhost)
    yield broker
    broker.cleanup()
