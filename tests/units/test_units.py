"""Pure functions: payload checks, backoff, durations, settings, lock names."""
from __future__ import annotations

import math
import random
from datetime import date, datetime
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cronbox.outbox.core.durations import parse_duration
from cronbox.outbox.core.errors import PayloadError, RegistrationError, SettingsError
from cronbox.outbox.core.locks import lock_name
from cronbox.outbox.core.payload import dump_payload, load_payload
from cronbox.outbox.core.server import supports_skip_locked
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.backoff import Backoff

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_any_json_value_round_trips(value):
    assert load_payload(dump_payload(value)) == value


@pytest.mark.parametrize("payload, where", [
    ({"when": datetime(2026, 1, 1)}, "payload['when'] is a datetime"),
    ({"a": [1, {"b": Decimal("1.5")}]}, "payload['a'][1]['b'] is a Decimal"),
    ({"d": date(2026, 1, 1)}, "payload['d'] is a date"),
    ({1: "x"}, "payload has a key 1 of type int"),
    ({"x": {"y"}}, "payload['x'] is a set"),
    ({"x": math.nan}, "payload['x'] is nan"),
    (object(), "payload is a object"),
])
def test_non_json_payload_names_the_offending_key(payload, where):
    with pytest.raises(PayloadError) as info:
        dump_payload(payload)
    assert where in str(info.value)


def test_exponential_backoff_grows_with_jitter_and_caps():
    policy = Backoff.of(5)
    rng = random.Random(7)
    delays = [policy.delay(n, rng) for n in range(1, 12)]
    assert 4 <= delays[0] <= 6
    # Doubling beats +-20% jitter until the cap: 5, 10, 20, ... 640 s.
    assert all(later > earlier for earlier, later in zip(delays[:8], delays[1:8]))
    assert max(delays) <= 900
    assert delays[-1] >= 900 * 0.8


def test_list_backoff_repeats_the_last_delay():
    policy = Backoff.of([1, 10, 60])
    assert [policy.delay(n) for n in (1, 2, 3, 4, 9)] == [1, 10, 60, 60, 60]


@pytest.mark.parametrize("spec", ["5", -1, [], [1, -2], True, {"a": 1}])
def test_bad_backoff_is_refused_at_registration(spec):
    with pytest.raises(RegistrationError):
        Backoff.of(spec)


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("5m", 300), ("48h", 172800), ("7d", 604800),
                                           ("2w", 1209600), ("1.5h", 5400), (" 10 m ", 600)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7x", "d7", "-1d", "1d2h"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("version, expected", [
    ("10.11.19-MariaDB-0+deb12u1", True), ("10.6.0-MariaDB", True), ("10.5.22-MariaDB-log", False),
    ("10.3.39-MariaDB", False), ("8.0.36", True), ("8.0.0", False), ("5.7.44-log", False),
])
def test_skip_locked_support_by_server_version(version, expected):
    assert supports_skip_locked(version) is expected


def test_lock_names_are_prefixed_and_fit_mysql():
    assert lock_name("shop", "tick") == "shop:tick"
    long = lock_name("u" * 80, "tick")
    assert len(long) <= 64 and long.endswith(":tick")
    assert long != lock_name("v" * 80, "tick")


def test_settings_defaults_resolve_against_the_app_root(tmp_path):
    settings = load_settings(app_root=tmp_path, environ={})
    assert settings.instance == tmp_path / "instance"
    assert settings.database_url == f"sqlite:///{tmp_path / 'instance' / 'cronbox.db'}"
    assert settings.claim_mode == "auto" and settings.lease_margin == 30 and settings.cron_interval == 1
    assert settings.mysql_tls == "off" and settings.handlers == ()


def test_dotenv_then_environment_and_relative_paths(tmp_path, monkeypatch):
    (tmp_path / ".env").write_text(
        "CRONBOX_INSTANCE=data/inst\nDATABASE_URL=sqlite:///db/x.db\nCRONBOX_HANDLERS= a.b , c \n"
        "CRONBOX_LEASE_MARGIN=5\nCRONBOX_CLAIM_MODE=token\n"
    )
    monkeypatch.chdir("/")
    settings = load_settings(app_root=tmp_path, environ={"CRONBOX_CLAIM_MODE": "skip-locked"})
    assert settings.instance == tmp_path / "data" / "inst"
    assert settings.database_url == f"sqlite:///{tmp_path / 'db' / 'x.db'}"
    assert settings.handlers == ("a.b", "c")
    assert settings.lease_margin == 5
    assert settings.claim_mode == "skip-locked"  # the environment wins over .env


@pytest.mark.parametrize("name, value, message", [
    ("CRONBOX_CLAIM_MODE", "fast", "is not one of"),
    ("CRONBOX_LEASE_MARGIN", "soon", "is not a number"),
    ("CRONBOX_CRON_INTERVAL", "0", "must be at least 1"),
    ("CRONBOX_CRON_INTERVAL", "1.5", "is not a number"),
    ("CRONBOX_LEASE_MARGIN", "nan", "is not a finite number"),
    ("CRONBOX_LEASE_MARGIN", "inf", "is not a finite number"),
    ("CRONBOX_LEASE_MARGIN", "1e400", "is not a finite number"),
    ("CRONBOX_MYSQL_TLS", "/nonexistent/ca.pem", "must be off, on"),
])
def test_bad_settings_say_which_and_why(tmp_path, name, value, message):
    with pytest.raises(SettingsError, match=message) as info:
        load_settings(app_root=tmp_path, environ={name: value})
    assert name in str(info.value)


@pytest.mark.parametrize("name, value, message", [
    ("CRONBOX_CHANNEL_TIMEOUT", "0", "must be more than 0"),
    ("CRONBOX_CHANNEL_PAUSE", "-5", "must be more than 0"),
    ("CRONBOX_CHANNEL_TIMEOUT", "nan", "is not a finite number"),
    ("CRONBOX_CHANNEL_PAUSE", "soon", "is not a number"),
    ("CRONBOX_SMTP_PORT", "587.5", "is not a number"),
    ("CRONBOX_SMTP_PORT", "0", "must be at least 1"),
])
def test_the_modules_numbers_go_through_the_settings_one_parser(tmp_path, name, value, message):
    """Settings.number is the one parser of plain numbers: the channels' settings are refused as the
    core's are, in the same words."""
    from cronbox.outbox.channels.config import channel_config

    settings = load_settings(app_root=tmp_path, environ={name: value})
    with pytest.raises(SettingsError, match=f"^{name}={value!r} {message}"):
        channel_config(settings)
    assert channel_config(load_settings(app_root=tmp_path, environ={name: "7"})).timeout in (7.0, 10.0)


@pytest.mark.parametrize("value, seconds", [(None, 30), ("45", 45.0), ("0.2", 1.0), ("soon", 30), ("nan", 30),
                                            ("-3", 30)])
def test_the_web_tick_reads_its_seconds_through_the_same_parser_and_falls_back_on_a_typo(tmp_path, value, seconds):
    from cronbox.web.webcron import _seconds

    environ = {} if value is None else {"CRONBOX_WEB_TICK_INTERVAL": value}
    assert _seconds(load_settings(app_root=tmp_path, environ=environ), "CRONBOX_WEB_TICK_INTERVAL", 30) == seconds


@pytest.mark.parametrize("char", ["\u202e", "\u202d", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f",
                                  "\u061c", "\x00", "\x1b", "\x7f", "\x9b"])
def test_handler_error_texts_escape_controls_and_bidi_marks(char):
    """A handler's error read in a log or the console must not be reordered or cut by what it carries
    (`pay\u202egnp.exe` would read as `payexe.png`): the same characters storage.display replaces."""
    from cronbox.outbox.core.text import clean_text
    from cronbox.storage.display import has_unshowable

    one_line = clean_text(f"pay{char}gnp.exe")
    traceback = clean_text(f"File x\n  line{char}\n", one_line=False)
    escaped = f"\\x{ord(char):02x}" if ord(char) <= 0xFF else f"\\u{ord(char):04x}"
    assert not has_unshowable(one_line) and one_line == f"pay{escaped}gnp.exe"
    assert traceback.splitlines()[0] == "File x" and not has_unshowable(traceback.replace("\n", ""))


def test_limited_lines_log_a_bounded_number_a_window_then_say_how_many_were_left_out(caplog):
    """outbox.core.logs.LimitedLines (amqp work's refused messages): per window, the first lines and
    then a count, said once the window is over (idle) or at once when the run stops (final)."""
    import logging

    from cronbox.outbox.core.logs import LimitedLines

    now = [0.0]
    lines = LimitedLines(logging.getLogger("cronbox.test"), "refused", per_window=2, window=60, monotonic=lambda: now[0])
    caplog.set_level("INFO", logger="cronbox.test")
    for n in range(5):
        lines.log("message %d", n)
    lines.flush()  # the window is not over: nothing yet
    assert [r.getMessage() for r in caplog.records] == ["message 0", "message 1"]
    now[0] = 60.0
    lines.flush()
    assert caplog.records[-1].getMessage() == "refused: 3 more not logged (at most 2 lines every 60s)"
    lines.flush(final=True)  # said once
    now[0] = 70.0
    for n in range(5, 9):  # the next burst: a new window, its own first lines, and a count when the run stops
        lines.log("message %d", n)
    lines.flush(final=True)
    assert [r.getMessage() for r in caplog.records][3:] == ["message 5", "message 6",
                                                            "refused: 2 more not logged (at most 2 lines every 60s)"]
    assert {r.levelname for r in caplog.records} == {"WARNING"}


def test_the_operator_log_switches_files_at_utc_midnight_and_each_line_says_its_own_second(tmp_path):
    """outbox.core.logs: the day's file and the line's time are made once a day and once a second
    (a run writes a line per item); a record of the next day, or of a later second, still gets its own."""
    import logging
    from datetime import datetime, timezone

    from cronbox.outbox.core.logs import DailyFileHandler, UtcFormatter

    handler = DailyFileHandler(tmp_path)
    handler.setFormatter(UtcFormatter())
    midnight = datetime(2026, 3, 2, tzinfo=timezone.utc).timestamp()
    for n, created in enumerate((midnight - 1.5, midnight - 1.25, midnight - 0.001, midnight, midnight + 0.5,
                                 midnight + 86400.0, midnight - 2.0)):
        record = logging.LogRecord("cronbox", logging.INFO, __file__, 1, f"line {n}", None, None)
        record.created, record.msecs = created, (created - int(created)) * 1000
        handler.emit(record)
    handler.close()
    lines = {path.name: path.read_text().splitlines() for path in tmp_path.iterdir()}
    assert {name: [line.split(" INFO ")[0] + " " + line.rsplit(" ", 1)[1] for line in text]
            for name, text in lines.items()} == {
        "cronbox-2026-03-01.log": ["2026-03-01T23:59:58.500Z 0", "2026-03-01T23:59:58.750Z 1",
                                   "2026-03-01T23:59:59.999Z 2", "2026-03-01T23:59:58.000Z 6"],
        "cronbox-2026-03-02.log": ["2026-03-02T00:00:00.000Z 3", "2026-03-02T00:00:00.500Z 4"],
        "cronbox-2026-03-03.log": ["2026-03-03T00:00:00.000Z 5"],
    }
