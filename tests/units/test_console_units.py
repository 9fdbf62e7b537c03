"""Console pieces without a web server: credentials files, the cookie key, cursors, redirects, CLI."""
from __future__ import annotations

from datetime import datetime

import pytest

from cronbox.outbox.core.settings import load_settings
from tests.conftest import run_cli
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


@pytest.mark.backends("sqlite")  # files and a few rows: the database kind changes nothing
def test_ops_commands_set_password_and_setup_token(env, runtime):
    settings = runtime.settings
    short = run_cli(env, "ops", "set-password", input_text="short\n")
    assert short.returncode == 2 and "at least 12" in short.stderr
    done = run_cli(env, "ops", "set-password", input_text="a long operator password\n")
    assert done.returncode == 0 and "password set" in done.stdout
    assert credentials.check_password(settings, "a long operator password")
    assert "long operator" not in done.stdout + done.stderr
    refused = run_cli(env, "ops", "setup-token")
    assert refused.returncode == 1 and "--reset" in refused.stderr
    reset = run_cli(env, "ops", "setup-token", "--reset")
    assert reset.returncode == 0 and not credentials.hash_file(settings).exists()
    token = credentials.token_file(settings).read_text().strip()
    assert token not in reset.stdout + reset.stderr  # the token is only ever in its file
    printed = run_cli(env, "ops", "set-password", "--print-hash", input_text="another long password\n")
    assert printed.returncode == 0 and printed.stdout.startswith("scrypt:")
    assert not credentials.hash_file(settings).exists()  # --print-hash writes nothing
    assert run_cli(env, "ops", "logout-all").stdout.startswith("ops: 0 console sessions ended")
    assert run_cli(env, "ops", "unlock").stdout.startswith("ops: login throttle cleared")
    broken = {**env, "DATABASE_URL": "mysql+pymysql://nobody:x@127.0.0.1:1/none"}
    offline = run_cli(broken, "ops", "set-password", input_text="set while the database is down\n")
    assert offline.returncode == 0 and "not recorded" in offline.stderr  # the file step does not need it
    assert credentials.check_password(settings, "set while the database is down")


def test_throttle_counts_ipv6_clients_per_64_and_unlock_clears_it(runtime):
    from datetime import datetime as dt

    from cronbox.cron.operator import throttle

    assert throttle.client_key("2001:db8:1:2:aaaa::1") == throttle.client_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert throttle.client_key("::ffff:203.0.113.9") == "203.0.113.9" and throttle.client_key(None) == "-"
    now = dt(2026, 11, 30, 12, 0, 0)
    tickets = []
    for n in range(throttle.PER_CLIENT[0]):
        with runtime.sessions.begin() as s:
            tickets.append(throttle.take(s, f"2001:db8:1:2::{n + 1}", now))
    assert all(t.wait is None for t in tickets)
    with runtime.sessions.begin() as s:
        refused = throttle.take(s, "2001:db8:1:2::ffff", now)
    assert refused.wait is not None and refused.first_refusal
    with runtime.sessions.begin() as s:
        assert not throttle.take(s, "2001:db8:1:2::fffe", now).first_refusal  # recorded once per window
        assert throttle.take(s, "2001:db8:1:3::1", now).wait is None  # another /64
    with runtime.sessions.begin() as s:
        assert throttle.unlock(s) >= 2
    with runtime.sessions.begin() as s:
        assert throttle.take(s, "2001:db8:1:2::1", now).wait is None
