"""PyMySQL as it comes, `cryptography` included: a MySQL 8 server that asks for the password
RSA-encrypted (caching_sha2_password over a connection without TLS) gets it.

cronbox once imported PyMySQL with `cryptography` refused and patched its encryption function to
load it later (~8 MB of RSS saved per cron process). It now uses the driver untouched, so
`cryptography` is a declared dependency and PyMySQL loads it itself.

The server here is a stand-in for MySQL 8's authentication only (the test suite's MariaDB has no
caching_sha2_password): its handshake asks for caching_sha2_password, answers the fast-path scramble
with "perform full authentication", sends its RSA public key when asked, decrypts what comes back
and accepts only the right password; then it answers OK to every statement until the client quits.
"""
from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import sys
import threading

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.conftest import APP_ROOT

PASSWORD = b"s3cret-pw"
# Capabilities: long password, connect with db, protocol 41, transactions, secure connection, multi
# results, plugin auth. No SSL: the client must protect the password itself.
CAPABILITIES = 0x1 | 0x8 | 0x200 | 0x2000 | 0x8000 | 0x20000 | 0x80000
OK = b"\x00\x00\x00" + struct.pack("<HH", 0, 0)  # affected rows 0, insert id 0, status (autocommit off), warnings


class MySQL8Auth:
    """Accepts one client on a loopback port; `outcome` says how its authentication went."""

    def __init__(self):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.salt = os.urandom(20).replace(b"\0", b"\1")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.outcome: str | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _send(self, sock, seq: int, payload: bytes) -> None:
        sock.sendall(struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload)

    def _read(self, sock) -> tuple[int, bytes]:
        header = self._exactly(sock, 4)
        length = int.from_bytes(header[:3], "little")
        return header[3], self._exactly(sock, length)

    @staticmethod
    def _exactly(sock, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("client went away")
            data += chunk
        return data

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        with sock:
            try:
                self._authenticate(sock)
                while self.outcome == "accepted":
                    _, command = self._read(sock)
                    if command[:1] == b"\x01":  # COM_QUIT
                        return
                    self._send(sock, 1, OK)
            except ConnectionError:
                pass

    def _authenticate(self, sock) -> None:
        handshake = (b"\x0a" + b"8.0.36\0" + struct.pack("<I", 7) + self.salt[:8] + b"\0"
                     + struct.pack("<H", CAPABILITIES & 0xFFFF) + bytes([45]) + struct.pack("<H", 0)
                     + struct.pack("<H", CAPABILITIES >> 16) + bytes([21]) + b"\0" * 10 + self.salt[8:] + b"\0"
                     + b"caching_sha2_password\0")
        self._send(sock, 0, handshake)
        self._read(sock)  # the handshake response with the fast-path scramble: not in this server's cache
        self._send(sock, 2, b"\x01\x04")  # perform full authentication
        seq, asked = self._read(sock)
        if asked != b"\x02":
            self.outcome = f"expected a public key request, got {asked!r}"
            return
        pem = self.key.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
        self._send(sock, seq + 1, b"\x01" + pem)
        seq, sealed = self._read(sock)
        oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
        plain = self.key.decrypt(sealed, oaep)
        password = bytes(b ^ self.salt[i % len(self.salt)] for i, b in enumerate(plain))
        if password == PASSWORD + b"\0":
            self.outcome = "accepted"
            self._send(sock, seq + 1, OK)
        else:
            self.outcome = "wrong password"
            self._send(sock, seq + 1, b"\xff" + struct.pack("<H", 1045) + b"#28000Access denied")


# In a fresh process: cronbox's MySQL engine made first (PyMySQL imported the way cronbox imports it),
# then a PyMySQL connection to the server above, which asks for the password RSA-encrypted.
CLIENT = """
import sys
import pymysql
from cronbox.outbox.core.engines import make_engine
from cronbox.outbox.core.settings import load_settings
make_engine(load_settings(environ={"CRONBOX_HANDLERS": ""}), url="mysql+pymysql://u:p@127.0.0.1:1/x")
connection = pymysql.connect(host="127.0.0.1", port=int(sys.argv[1]), user="u", password=sys.argv[2],
                             database="x", connect_timeout=10)
connection.close()
print("connected")
"""


def test_a_server_asking_for_the_password_rsa_encrypted_gets_it_and_accepts_it():
    server = MySQL8Auth()
    proc = subprocess.run([sys.executable, "-c", CLIENT, str(server.port), PASSWORD.decode()], cwd=APP_ROOT,
                          capture_output=True, text=True, timeout=60)
    server.thread.join(timeout=10)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["connected"] and server.outcome == "accepted"


def test_the_stand_in_server_refuses_a_wrong_password():
    """The check above can fail: the server decrypts and compares, it does not accept anything."""
    server = MySQL8Auth()
    proc = subprocess.run([sys.executable, "-c", CLIENT, str(server.port), "not-it"], cwd=APP_ROOT,
                          capture_output=True, text=True, timeout=60)
    server.thread.join(timeout=10)
    assert proc.returncode != 0 and "Access denied" in proc.stderr
    assert server.outcome == "wrong password"


def test_cryptography_is_a_declared_dependency():
    """PyMySQL declares it only as an extra (`pymysql[rsa]`): cronbox's own requirements carry it."""
    pinned = (APP_ROOT / "requirements.txt").read_text()
    ranges = (APP_ROOT / "pyproject.toml").read_text()
    assert re.search(r"^cryptography==", pinned, re.M)
    assert re.search(r'^\s*"cryptography>=', ranges, re.M)
