"""PyMySQL as it comes, `cryptography` included: a MySQL 8 server that asks for the password
RSA-encrypted (sha256_password / caching_sha2_password over a connection without TLS) gets it.

cronbox once imported PyMySQL with `cryptography` refused and patched its encryption function to
load it later (~8 MB of RSS saved per cron process). It now uses the driver untouched, so
`cryptography` is a declared dependency and loads with PyMySQL."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import APP_ROOT

# In a fresh process: cronbox's MySQL engine made (no server needed), then the RSA step of PyMySQL's
# sha2 authentication with a server's public key, checked by decrypting with the private key.
CHECK = """
import sys
from outbox.core.engines import make_engine
from outbox.core.settings import load_settings
make_engine(load_settings(), url="mysql+pymysql://u:p@127.0.0.1:1/x")
print('cryptography' in sys.modules)
from pymysql import _auth
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
sealed = _auth.sha2_rsa_encrypt(b"secret", b"s" * 20, pem)
oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
plain = key.decrypt(sealed, oaep)
print(bytes(a ^ b for a, b in zip(plain, (b"s" * 20) * 2)) == b"secret\\0")
"""


def test_pymysql_loads_its_cryptography_and_encrypts_a_password_for_a_server_that_asks():
    proc = subprocess.run([sys.executable, "-c", CHECK], cwd=APP_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]


def test_cryptography_is_a_declared_dependency():
    """PyMySQL declares it only as an extra (`pymysql[rsa]`): cronbox's own requirements carry it."""
    pinned = (APP_ROOT / "requirements.txt").read_text()
    ranges = (APP_ROOT / "pyproject.toml").read_text()
    assert re.search(r"^cryptography==", pinned, re.M)
    assert re.search(r'^\s*"cryptography>=', ranges, re.M)
