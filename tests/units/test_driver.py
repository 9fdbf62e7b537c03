"""PyMySQL without `cryptography` until a server asks for RSA (outbox/core/db.py)."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import APP_ROOT

CHECK = """
import sys
from outbox.core import db
db._import_pymysql_without_cryptography()
import pymysql
print('cryptography' in sys.modules)
from pymysql import _auth
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
sealed = _auth.sha2_rsa_encrypt(b"secret", b"s" * 20, pem)
oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
print(key.decrypt(sealed, oaep) == _auth._xor_password(b"secret" + b"\\0", b"s" * 20))
"""


def test_pymysql_loads_without_cryptography_and_still_encrypts_a_password_when_asked():
    proc = subprocess.run([sys.executable, "-c", CHECK], cwd=APP_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]
