"""Durations with units, everywhere they are accepted: one parser (outbox.core.durations), a bare
number refused rather than read as seconds (CRONBOX_AUDIT_RETENTION=2192 erased six years of audit
trail as 2,192 seconds), and the audit records' six-year floor (HIPAA 45 CFR 164.316(b)(2))."""
from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from cronbox import Cronbox
from cronbox.outbox.core.durations import parse_duration
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.settings import AUDIT_RETENTION_FLOOR_DAYS, MODULE_DURATIONS, load_settings
from tests.conftest import APP_ROOT

# Every setting that takes a duration with a unit, and a value each one accepts.
DURATION_SETTINGS = {"CRONBOX_URL_MAX_TTL": "15m", "CRONBOX_AUDIT_RETENTION": "2192d", "CRONBOX_METRICS_WINDOW": "1h",
                     "CRONBOX_PROFILE_TTL": "7d", "CRONBOX_ADMISSION_TIME_HEADROOM": "2s",
                     "CRONBOX_FORWARD_WARN_AFTER": "10m", "CRONBOX_FORWARD_FAIL_AFTER": "1h", "CRONBOX_ACK_FLUSH": "500ms",
                     "CRONBOX_RESULT_TTL": "7d", "CRONBOX_IDEMPOTENCY_TTL": "1d"}
BARE = ["2192", "0", "7", "1.5", " 30 ", "3600"]
NEGATIVE = ["-1d", "-5", "-0.5h"]
ZERO = ["0s", "0d", "0.0h", "000m"]
GARBAGE = ["", "7x", "d7", "forever", "1d2h", "7dd", "nan", "inf", "1e3s", "0x10s", "\u0663d", "7d;rm -rf", "7\u00a0d",
           "1_000s", "+5d", "7 days", ".5h", "5.h"]
HUGE = ["99999999999d", "1" + "0" * 400 + "s", "36601d", "5300w"]


def test_the_module_table_names_every_duration_setting_a_module_reads():
    """load_settings parses MODULE_DURATIONS up front: a module's own Settings.duration() read missing
    there would only fail when that module runs, not at every command and init_app."""
    read = set()
    for package in ("cronbox",):
        for path in (APP_ROOT / package).rglob("*.py"):
            read |= set(re.findall(r'\.duration\(\s*"(CRONBOX_[A-Z_]+)"', path.read_text(encoding="utf-8")))
    assert read and read == set(MODULE_DURATIONS)
    assert set(MODULE_DURATIONS) <= set(DURATION_SETTINGS)


@pytest.mark.parametrize("text, seconds", [(" 7d ", 604800), ("\t48h\n", 172800), ("7 d", 604800), ("90S", 90),
                                           ("36600d", 36600 * 86400), ("0.5s", 0.5), ("2W", 1209600),
                                           ("500ms", 0.5), ("1.5 MS", 0.0015)])
def test_units_with_surrounding_or_inner_spaces_and_any_case_are_read(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", BARE)
def test_a_bare_number_is_refused_with_the_unit_to_add(text):
    with pytest.raises(ValueError, match=r"a duration needs a unit \(s, m, h, d\), e\.g\. "):
        parse_duration(text)


@pytest.mark.parametrize("text, says", [*[(t, "is not a duration") for t in NEGATIVE[:1] + GARBAGE],
                                        *[(t, "more than zero") for t in ZERO],
                                        *[(t, "at most 36600d") for t in HUGE]])
def test_negative_zero_garbage_and_huge_durations_are_refused(text, says):
    with pytest.raises(ValueError, match=says):
        parse_duration(text)


def test_the_settings_error_for_a_bare_audit_retention_is_the_one_line_asked_for():
    with pytest.raises(SettingsError) as refused:
        load_settings(environ={"CRONBOX_AUDIT_RETENTION": "2192"})
    assert str(refused.value) == "CRONBOX_AUDIT_RETENTION=2192: a duration needs a unit (s, m, h, d), e.g. 2192d"


@pytest.mark.parametrize("name", sorted(DURATION_SETTINGS))
@pytest.mark.parametrize("value", [*BARE[:3], *NEGATIVE, *ZERO[:2], *GARBAGE[1:8], *HUGE[:2], "7\nd\nx"])
def test_every_duration_setting_refuses_a_bad_value_by_name_in_one_line(name, value):
    with pytest.raises(SettingsError) as refused:
        load_settings(environ={name: value})
    message = str(refused.value)
    assert message.startswith(f"{name}=") and "\n" not in message


@pytest.mark.parametrize("name, value", sorted(DURATION_SETTINGS.items()))
def test_every_duration_setting_takes_a_value_with_a_unit(name, value):
    load_settings(environ={name: f"  {value} "})


@pytest.mark.parametrize("value", ["2191d", "30d", "52w", "313w", "52560h", "6d", "1s"])
def test_an_audit_retention_below_six_years_is_refused_naming_the_floor_and_why(value):
    with pytest.raises(SettingsError) as refused:
        load_settings(environ={"CRONBOX_AUDIT_RETENTION": value})
    message = str(refused.value)
    assert message.startswith(f"CRONBOX_AUDIT_RETENTION={value} is below its floor of 2192d")
    assert "HIPAA" in message and "164.316(b)(2)" in message and "six years" in message


@pytest.mark.parametrize("value, days", [("2192d", 2192), ("314w", 2198), ("52608h", 2192), ("3650d", 3650)])
def test_six_years_or_more_of_audit_retention_is_taken(value, days):
    assert load_settings(environ={"CRONBOX_AUDIT_RETENTION": value}).audit_retention_days == days


def test_settings_made_in_code_below_the_floor_give_no_audit_cutoff():
    """The library's own guard: a Settings built or replaced in code (the standalone app, a test)
    never yields a cutoff that deletes audit records younger than six years."""
    short = replace(load_settings(environ={}), audit_retention_days=AUDIT_RETENTION_FLOOR_DAYS - 1)
    with pytest.raises(SettingsError, match="below its floor of 2192d"):
        short.audit_cutoff(datetime(2026, 12, 2))


def _host(tmp_path, **config) -> Flask:
    app = Flask("clinic", root_path=str(tmp_path), instance_path=str(tmp_path / "instance"))
    app.config.update(CRONBOX_HANDLERS="", SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'clinic.db'}", **config)
    db = SQLAlchemy()
    db.init_app(app)
    Cronbox().init_app(app, db=db)
    return app


@pytest.mark.parametrize("name", sorted(DURATION_SETTINGS))
@pytest.mark.parametrize("value", [2192, 30, 0, -1, 2.5, "2192"])
def test_a_number_in_the_host_apps_config_is_refused_at_init_app(tmp_path, monkeypatch, name, value):
    """app.config["CRONBOX_AUDIT_RETENTION"] = 2192 (an int) is as ambiguous as the text: refused."""
    for var in ("CRONBOX_APP_ROOT", "CRONBOX_INSTANCE", "DATABASE_URL", *DURATION_SETTINGS):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SettingsError) as refused:
        _host(tmp_path, **{name: value})
    assert str(refused.value).startswith(f"{name}=") and "\n" not in str(refused.value)


def test_a_below_floor_retention_in_the_host_apps_config_is_refused_at_init_app(tmp_path, monkeypatch):
    monkeypatch.delenv("CRONBOX_AUDIT_RETENTION", raising=False)
    with pytest.raises(SettingsError, match="CRONBOX_AUDIT_RETENTION=365d is below its floor"):
        _host(tmp_path, CRONBOX_AUDIT_RETENTION="365d")
    _host(tmp_path / "ok", CRONBOX_AUDIT_RETENTION="2555d")
