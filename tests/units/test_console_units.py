"""Console pieces without a web server: credentials files, the cookie key, cursors, redirects, CLI."""
from __future__ import annotations

from datetime import datetime

import pytest

from cronbox.outbox.core.settings import load_settings
from cronbox.cron.operator import credentials
from cronbox.outbox.core import paging


@pytest.fixture
def plain_settings(tmp_path):
    return load_settings(app_root=tmp_path, environ={"CRONBOX_INSTANCE": str(tmp_path / "instance")})


def test_password_file_first_writer_wins_and_env_overrides(plain_settings, tmp_path):
    s = plain_settings
    assert credentials.password_hash(s) is None and not credentials.check_password(s, "anything at all")
    token = credentials.ensure_setup_token(s)
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) >= 30
    assert credentials.ensure_setup_token(s) == token and credentials.check_setup_token(s, token.read_text())
    assert not credentials.check_setup_token(s, "") and not credentials.check_setup_token(s, "nope")
    credentials.store_password(s, "first password here", replace=False)
    with pytest.raises(credentials.CredentialError, match="already been set"):
        credentials.store_password(s, "second password here", replace=False)
    assert credentials.check_password(s, "first password here") and not credentials.check_password(s, "second")
    assert not token.exists() and credentials.ensure_setup_token(s) is None
    assert not credentials.check_password(s, "x" * (credentials.MAX_PASSWORD + 1))

    # A hash in .env wins, even written with its $ signs unquoted-safe in single quotes.
    (tmp_path / ".env").write_text(f"CRONBOX_OPS_PASSWORD_HASH='{credentials.make_hash('from dotenv file')}'\n")
    from_env = load_settings(app_root=tmp_path, environ={"CRONBOX_INSTANCE": str(tmp_path / "instance")})
    assert credentials.check_password(from_env, "from dotenv file")
    assert not credentials.check_password(from_env, "first password here")
    with pytest.raises(credentials.CredentialError, match="wins over the password file"):
        credentials.store_password(from_env, "another one here", replace=True)


def test_a_malformed_hash_refuses_every_login(tmp_path):
    s = load_settings(app_root=tmp_path, environ={"CRONBOX_INSTANCE": str(tmp_path / "i"),
                                                  "CRONBOX_OPS_PASSWORD_HASH": "not-a-hash"})
    assert not credentials.check_password(s, "not-a-hash")


@pytest.mark.parametrize("password, confirm, problem", [
    ("short", "short", "at least 12"), ("long enough pass", "long enough pasS", "differ"),
    ("x" * 1025, "x" * 1025, "at most")])
def test_new_password_rules(password, confirm, problem):
    with pytest.raises(credentials.CredentialError, match=problem):
        credentials.validate_new_password(password, confirm)


def test_cursors_parse_or_refuse():
    assert paging.parse_cursor(None, (int,)) is None
    assert paging.parse_cursor("42", (int,)) == (42,)
    assert paging.parse_cursor("2026-11-30T12:00:00.500000~7", (datetime, int)) == (
        datetime(2026, 11, 30, 12, 0, 0, 500000), 7)
    for bad, kinds in [("x", (int,)), ("1~2", (int,)), ("yesterday~3", (datetime, int)), ("1" * 300, (int,)),
                       ("2026-11-30T12:00:00+05:00~7", (datetime, int)), (str(2**63), (int,))]:
        with pytest.raises(paging.BadCursor):
            paging.parse_cursor(bad, kinds)
