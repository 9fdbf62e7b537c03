"""A misconfigured duration or retention deletes nothing: `storage sweep` and the daily prune refuse
to start (one line, exit 1) instead of reading CRONBOX_AUDIT_RETENTION=2192 as 2,192 seconds; every
command option that takes a duration refuses a bare number, a negative, zero, garbage or a huge value
with one line and exit 2; the prune options have floors."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import func, select

from cronbox.cron.operator.models import OperatorAction
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.transactions import in_transaction
from cronbox.storage import audit, maintenance
from cronbox.storage.models import AuditEntry
from tests.conftest import run_cli
from tests.helpers import invoke
from tests.storage_helpers import store  # noqa: F401  (fixture)

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked", "postgresql")

AGES_DAYS = (1, 30, 400, 3 * 365, 2000, 2300)  # the last is past six years: the only one a sweep may delete
MISCONFIGURED = ["2192", "2191d", "30d", "52w", "0s", "-1d", "soon", "99999999999d", "2192 days"]


def _seed(runtime) -> None:
    now = clock.utcnow()

    def add(session):
        for days in AGES_DAYS:
            audit.record(session, "download", "ok", file_id="f" * 32).at = now - timedelta(days=days)
            session.add(OperatorAction(at=now - timedelta(days=days), operator="operator", action="login",
                                       outcome="ok"))
    in_transaction(runtime.sessions, add)


def _counts(runtime) -> tuple[int, int]:
    with runtime.sessions() as session:
        return (session.scalar(select(func.count()).select_from(AuditEntry)),
                session.scalar(select(func.count()).select_from(OperatorAction)))


@pytest.mark.parametrize("value", MISCONFIGURED)
def test_a_sweep_and_the_daily_prune_with_a_bad_audit_retention_delete_nothing(runtime, store, env, value):
    _seed(runtime)
    bad = {**env, "CRONBOX_AUDIT_RETENTION": value}
    for command in (["storage", "sweep"], ["schedule", "run", "cronbox.prune"], ["schedule", "run",
                                                                                 "cronbox.storage_sweep"]):
        result = invoke(bad, *command)
        assert result.exit_code == 1, (command, result.output)
        assert "CRONBOX_AUDIT_RETENTION=" in result.output and len(result.output.strip().splitlines()) == 1
    assert _counts(runtime) == (len(AGES_DAYS), len(AGES_DAYS))


def test_six_years_deletes_only_what_is_older(runtime, store, env):
    _seed(runtime)
    good = {**env, "CRONBOX_AUDIT_RETENTION": "2192d"}
    assert invoke(good, "storage", "sweep").exit_code == 0
    assert invoke(good, "schedule", "run", "cronbox.prune").exit_code == 0
    assert _counts(runtime) == (len(AGES_DAYS) - 1, len(AGES_DAYS) - 1)


def test_a_sweep_with_settings_below_the_floor_made_in_code_deletes_nothing(runtime, store):
    """The library guard under the settings check: Storage built on a Settings replaced in code."""
    _seed(runtime)
    short = maintenance.Sweepable(replace(runtime.settings, audit_retention_days=30), runtime.sessions, store.vault)
    with pytest.raises(SettingsError, match="below its floor"):
        maintenance.sweep(short, grace=86400)
    from cronbox.cron.scheduling.retention import prune_all

    with pytest.raises(SettingsError, match="below its floor"):
        prune_all(SimpleNamespace(settings=short.settings, sessions=runtime.sessions))
    assert _counts(runtime) == (len(AGES_DAYS), len(AGES_DAYS))


OPTIONS = [
    ["outbox", "prune", "--older-than"],
    ["queue", "prune", "--older-than"],
    ["queue", "flush", "--older-than"],
    ["storage", "grant", "f" * 32, "--subject", "patient:1", "--expires-in"],
    ["storage", "url", "g" * 32, "--ttl"],
    ["storage", "sweep", "--grace"],
]


@pytest.mark.backends("sqlite")  # refused while parsing the command line: no database is opened
@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: " ".join(x for x in o if len(x) < 30))
@pytest.mark.parametrize("value, says", [
    ("7", "a duration needs a unit (s, m, h, d), e.g. 7d"), ("3600", "needs a unit"), ("1.5", "needs a unit"),
    ("-1d", "is not a duration"), ("-7", "is not a duration"), ("0s", "more than zero"), ("0", "needs a unit"),
    ("soon", "is not a duration"), ("7x", "is not a duration"), ("1d2h", "is not a duration"),
    ("99999999999d", "at most 36600d"), ("1" + "0" * 300 + "s", "at most 36600d"), ("7 days", "is not a duration"),
])
def test_every_duration_option_refuses_a_bad_value_in_one_line(env, option, value, says):
    result = invoke(env, *option, value)
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("option, value", [(["outbox", "prune", "--older-than"], "59m"),
                                           (["queue", "prune", "--older-than"], "3599s"),
                                           (["outbox", "prune", "--older-than"], "1s"),
                                           (["storage", "sweep", "--grace"], "59m")])
def test_the_prune_options_have_a_floor(env, option, value):
    result = invoke(env, *option, value)
    assert result.exit_code == 2 and "must be at least 1h" in result.output


@pytest.mark.parametrize("args", [["outbox", "prune", "--older-than", " 36600d "], ["queue", "prune", "--older-than",
                                                                                  "36600d"],
                                  ["queue", "flush", "--older-than", "36600d"], ["outbox", "prune", "--older-than", "1h"]])
def test_the_largest_and_smallest_durations_run(runtime, env, args):
    """A century back is still a date (no overflow, no traceback); the floor itself is taken."""
    result = invoke(env, *args)
    assert result.exit_code == 0, result.output


def test_a_grant_past_its_limit_is_one_line_not_a_traceback(runtime, store, env):
    from tests.storage_helpers import put

    file_id = put(store, b"scan")
    result = invoke(env, "storage", "grant", file_id, "--subject", "patient:1", "--expires-in", "36600d")
    assert result.exit_code == 1 and "expires_in must be" in result.output


@pytest.mark.parametrize("command", [["tick", "--max-time", "1", "--no-linger"], ["storage", "sweep"],
                                     ["schedule", "run", "cronbox.prune"], ["outbox", "status"], ["migrate"],
                                     ["health"]])
def test_every_command_refuses_a_bare_retention_with_one_line(runtime, env, command):
    proc = run_cli({**env, "CRONBOX_AUDIT_RETENTION": "2192"}, *command)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("error: CRONBOX_AUDIT_RETENTION=2192: a duration needs a unit (s, m, h, d), "
                                   "e.g. 2192d")
