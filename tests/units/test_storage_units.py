"""Pure pieces of sealed storage and its web side: ranges, file names, client IPs, tokens, settings."""
from __future__ import annotations

import os
from datetime import datetime

import pytest
from flask import Flask, request
from hypothesis import given, strategies as st

from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.settings import load_settings
from cronbox.storage.tokens import Tokens, TokenRefused
from cronbox.web.client import client_ip
from cronbox.web.disposition import clean_name, content_disposition, content_type
from cronbox.web.ranges import plan

ETAG = '"abc"'


@pytest.mark.parametrize("header, if_range, size, expected", [
    (None, None, 100, (200, 0, 100)),
    ("bytes=0-0", None, 100, (206, 0, 1)),
    ("bytes=0-0", None, 0, (416, 0, 0)),
    ("bytes=99-", None, 100, (206, 99, 100)),
    ("bytes=100-", None, 100, (416, 0, 0)),
    ("bytes=-1", None, 100, (206, 99, 100)),
    ("bytes=-0", None, 100, (416, 0, 0)),
    ("bytes=-500", None, 100, (206, 0, 100)),
    ("bytes=5-2", None, 100, (200, 0, 100)),
    ("bytes=0-1,3-4", None, 100, (200, 0, 100)),
    ("bytes=0-1,", None, 100, (206, 0, 2)),  # empty list elements are allowed
    ("bytes=1-" + "9" * 5000, None, 100, (206, 1, 100)),
    ("bytes=" + "9" * 5000 + "-", None, 100, (416, 0, 0)),
    ("pages=1-2", None, 100, (200, 0, 100)),
    ("bytes=0-9", ETAG, 100, (206, 0, 10)),
    ("bytes=0-9", '"other"', 100, (200, 0, 100)),
])
def test_range_plans(header, if_range, size, expected):
    answer = plan(header, if_range, ETAG, size)
    assert (answer.status, answer.start, answer.stop) == expected


@given(header=st.text(max_size=80), size=st.integers(min_value=0, max_value=10 ** 12))
def test_range_plans_are_always_within_the_file(header, size):
    answer = plan(header, None, ETAG, size)
    assert answer.status in (200, 206, 416)
    if answer.status != 416:
        assert 0 <= answer.start <= answer.stop <= size
    if answer.status == 206:
        assert answer.stop > answer.start


@pytest.mark.parametrize("name, cleaned", [
    ("report.pdf", "report.pdf"),
    ("../../etc/passwd", "passwd"),
    ("C:\\Users\\x\\scan.png", "scan.png"),
    ('a"b;c\r\nSet-Cookie: x\x00.pdf', "a_b_c__Set-Cookie_ x_.pdf"),
    ("invoice\u202efdp.exe", "invoice_fdp.exe"),
    ("..", "download"),
    ("", "download"),
    (None, "download"),
    ("CON.txt", "_CON.txt"),
    ("x" * 400 + ".pdf", "x" * 146 + ".pdf"),
    ("نتیجه آزمایش.pdf", "نتیجه آزمایش.pdf"),
])
def test_clean_names(name, cleaned):
    assert clean_name(name) == cleaned


def test_content_disposition_has_an_ascii_fallback_and_the_utf8_name():
    header = content_disposition("Résultat – 😀;\"x\".pdf")
    assert header.startswith('attachment; filename="Resultat __x_.pdf"; filename*=UTF-8\'\'R%C3%A9sultat%20%E2%80%93')
    assert "%F0%9F%98%80" in header and "\r" not in header and "\n" not in header
    assert content_disposition("نتیجه.pdf").startswith('attachment; filename="download.pdf"')


@given(name=st.text(max_size=400))
def test_content_disposition_is_always_one_safe_header(name):
    header = content_disposition(name)
    assert header.isascii() and header.isprintable()
    fallback = header.split('filename="', 1)[1].split('"', 1)[0]
    assert ";" not in fallback and "\\" not in fallback and "/" not in fallback
    assert len(header) < 1200


@pytest.mark.parametrize("declared, served", [
    ("application/pdf", "application/pdf"), ("Image/PNG", "image/png"), ("text/html; charset=utf-8", "text/html"),
    ("text/html\r\nX: y", "application/octet-stream"), ("nonsense", "application/octet-stream"), (None,
                                                                                                "application/octet-stream"),
])
def test_content_types(declared, served):
    assert content_type(declared) == served


@pytest.mark.parametrize("forwarded, hops, expected", [
    (None, 0, "192.0.2.1"), ("203.0.113.5", 0, "192.0.2.1"), ("203.0.113.5", 1, "203.0.113.5"),
    ("spoofed, 203.0.113.5", 1, "203.0.113.5"), ("198.51.100.7, 203.0.113.5", 2, "198.51.100.7"),
    ("203.0.113.5", 2, "192.0.2.1"), ("not-an-ip", 1, "192.0.2.1"), ("2001:db8::1", 1, "2001:db8::1"),
])
def test_client_ip(forwarded, hops, expected):
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    with Flask(__name__).test_request_context(headers=headers, environ_base={"REMOTE_ADDR": "192.0.2.1"}):
        assert client_ip(request, hops) == expected


def test_tokens_carry_only_opaque_claims_and_check_exp_and_max_age():
    keys = [os.urandom(32)]
    tokens = Tokens(keys, max_ttl=600)
    with clock.frozen(datetime(2026, 5, 1, 12, 0)):
        token, claims = tokens.issue("ab" * 16, 60)
        assert tokens.verify(token) == claims and claims.exp - 60 > 0
        with pytest.raises(ValueError):
            tokens.issue("ab" * 16, 601)
        clock.advance(60)
        with pytest.raises(TokenRefused) as refused:
            tokens.verify(token)
        assert refused.value.expired and refused.value.claims == claims
    with clock.frozen(datetime(2026, 5, 1, 11, 0)):
        with pytest.raises(TokenRefused) as refused:
            tokens.verify(token)
        assert refused.value.reason == "future-dated" and not refused.value.expired
    for bad in ("", "a" * 513, "abc def", "a/b", "é"):
        with pytest.raises(TokenRefused, match="malformed"):
            tokens.verify(bad)
    rotated = Tokens([*keys, os.urandom(32)], max_ttl=600)
    with clock.frozen(datetime(2026, 5, 1, 12, 0, 30)):
        assert rotated.verify(token) == claims  # signed with the older key
        with pytest.raises(TokenRefused, match="bad-signature"):
            Tokens([os.urandom(32)], max_ttl=600).verify(token)


def test_storage_settings():
    settings = load_settings(environ={"CRONBOX_UPLOAD_MAX": "1.5G", "CRONBOX_URL_MAX_TTL": "15m",
                                      "CRONBOX_SEAL_ALGORITHM": "XChaCha20-Poly1305", "CRONBOX_AUDIT_RETENTION": "2555d",
                                      "CRONBOX_KEYS": "secrets/keys", "CRONBOX_WEB_ROOT": "/srv/www, public"})
    assert settings.upload_max == int(1.5 * 1024 ** 3) and settings.url_max_ttl == 900
    assert settings.seal_algorithm == "xchacha20-poly1305" and settings.audit_retention_days == 2555
    assert settings.key_folder == settings.app_root / "secrets" / "keys"
    assert settings.web_roots[0].as_posix() == "/srv/www" and settings.web_roots[1] == settings.app_root / "public"
    defaults = load_settings(environ={"HOME": "/home/clinic"})
    assert defaults.key_folder == defaults.instance / "keys" and defaults.upload_max == 256 * 1024 ** 2
    assert defaults.web_roots[0].as_posix() == "/home/clinic/public_html"
    for name, value in (("CRONBOX_UPLOAD_MAX", "lots"), ("CRONBOX_URL_MAX_TTL", "0"),
                        ("CRONBOX_SEAL_ALGORITHM", "rot13"), ("CRONBOX_AUDIT_RETENTION", "forever")):
        with pytest.raises(SettingsError, match=name):
            load_settings(environ={name: value})
