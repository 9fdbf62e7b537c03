"""The console's operator on a database: the `ops` commands (set-password, setup-token, logout-all,
unlock) and the login throttle's rows."""
from __future__ import annotations

import pytest

from cronbox.cron.operator import credentials
from tests.conftest import run_cli


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
