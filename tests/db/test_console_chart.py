"""The overview's 24-hour chart, from synthetic heartbeat rows with frozen time (SQLite and MariaDB)."""
from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from cronbox.outbox.core import clock
from cronbox.outbox.engine.models import Heartbeat
from tests.console_helpers import logged_in, make_app
from cronbox.web.ops import chart

# The chart drawn from the rows: the server behind them changes nothing, so not PostgreSQL too (.ci/run's
# 30 minutes; the console's queries run on it in tests/web/test_console.py).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")
NOW = datetime(2026, 11, 30, 12, 30, 40)
START = datetime(2026, 11, 29, 12, 31)  # the first of the 1440 minutes shown


def beat(session, at: datetime, *, command="tick", delivered=0, jobs_done=0, backlog=None, outcome="idle"):
    session.add(Heartbeat(command=command, host="h", pid=1, started_at=at, finished_at=at + timedelta(seconds=2),
                          outcome=outcome, delivered=delivered, retried=0, dead=0, jobs_done=jobs_done,
                          jobs_failed=0, backlog=backlog))


@pytest.fixture
def beats(runtime):
    with runtime.sessions.begin() as s:
        beat(s, START - timedelta(seconds=1), delivered=999, backlog=999)  # just before the window: not shown
        beat(s, START + timedelta(seconds=5), delivered=3, jobs_done=2, backlog=7)  # minute 0
        beat(s, START + timedelta(minutes=1, seconds=10), delivered=10, backlog=40)  # minute 1
        beat(s, START + timedelta(minutes=1, seconds=50), command="work", jobs_done=30)  # minute 1, a worker
        beat(s, START + timedelta(minutes=1, seconds=55), backlog=25, outcome="error")  # minute 1, a failed tick
        beat(s, START + timedelta(minutes=600), delivered=0, backlog=0)  # minute 600 (22:31)
        beat(s, NOW - timedelta(seconds=30), delivered=5, backlog=2)  # the current minute (1439)
        beat(s, NOW + timedelta(minutes=1), delivered=999)  # the future (a clock skew): not shown


def test_series_per_minute(runtime, beats):
    with clock.frozen(NOW), runtime.sessions() as session:
        data = chart.series(session, clock.utcnow())
    assert data.start == START and len(data.handled) == chart.MINUTES
    assert data.handled[0] == 5 and data.handled[1] == 40 and data.handled[1439] == 5 and sum(data.handled) == 50
    assert data.backlog[0] == 7 and data.backlog[1] == 40 and data.backlog[600] == 0 and data.backlog[1439] == 2
    assert data.backlog[2] is None and data.ticks[1] == 2 and data.ticks[2] == 0 and data.errors[1] == 1
    assert sum(data.missed()) == chart.MINUTES - 4
    missed_every_5 = data.missed(5)  # cron every 5 minutes: only a quiet stretch of 5+ minutes is missed
    assert missed_every_5[:6] == [False, False, False, False, False, False] and missed_every_5[6] is True
    assert missed_every_5[600:605] == [False] * 5 and missed_every_5[605] is True


def test_drawing_scales_and_marks_gaps(runtime, beats):
    with clock.frozen(NOW), runtime.sessions() as session:
        drawing = chart.draw(chart.series(session, clock.utcnow()))
    assert drawing.handled_max == 50 and drawing.backlog_max == 50
    assert drawing.handled_path == "M0 100V90 M1 100V20 M1439 100V90"
    assert drawing.backlog_path == "M0 86 L1 20 M600 100 M1439 96"
    assert drawing.error_path == "M1 0V4"
    assert drawing.gap_path.startswith("M2 102V106 M3 102V106") and "M600 " not in drawing.gap_path
    assert drawing.gap_path.count("M") == chart.MINUTES - 4
    assert drawing.hour_marks[0] == (149, "15:00") and [label for _, label in drawing.hour_marks][-1] == "12:00"
    assert drawing.summary == ("Last 24 hours: 50 items handled; peak 40 per minute at 12:32 UTC; backlog 2 at the "
                               "last tick, peak 40 at 12:32 UTC; 1,436 of 1,440 minutes without a tick; 1 failed runs.")


def test_the_overview_draws_it(runtime, env, beats):
    application = make_app(env, runtime)
    try:
        with clock.frozen(NOW):
            page = logged_in(application).get("/ops/").get_data(as_text=True)
        assert 'd="M0 100V90 M1 100V20 M1439 100V90"' in page and 'd="M0 86 L1 20 M600 100 M1439 96"' in page
        assert "1,436 of 1,440 minutes without a tick" in page
    finally:
        application.extensions["cronbox"].runtime.dispose()


@pytest.mark.parametrize("value, expected", [(0, 1), (1, 1), (2, 2), (3, 5), (7, 10), (10, 10), (11, 20),
                                             (199, 200), (201, 500), (12345, 20000)])
def test_nice_ceiling(value, expected, backend):
    assert chart.nice_ceiling(value) == expected


def test_small_counts_still_show_and_the_interval_sets_the_gaps(runtime, beats):
    with runtime.sessions.begin() as s:
        beat(s, START + timedelta(minutes=700), delivered=1, backlog=0)
        beat(s, START + timedelta(minutes=800), delivered=400, backlog=0)
    with clock.frozen(NOW), runtime.sessions() as session:
        drawing = chart.draw(chart.series(session, clock.utcnow()), interval=5)
    assert drawing.handled_max == 500 and "M700 100V99" in drawing.handled_path  # 1 of 500 still shows
    # Ticks at minutes 0, 1, 600, 700, 800 and 1439: missed are 6-599, 605-699, 705-799 and 805-1438.
    assert drawing.gap_path.count("M") == 594 + 95 + 95 + 634
    assert "1,418 of 1,440 minutes without a tick in the 5 minutes before" in drawing.summary


def test_an_empty_day(runtime):
    with clock.frozen(NOW), runtime.sessions() as session:
        drawing = chart.draw(chart.series(session, clock.utcnow()))
    assert drawing.handled_path == "" and drawing.backlog_path == "" and drawing.error_path == ""
    assert drawing.summary == "Last 24 hours: 0 items handled; 1,440 of 1,440 minutes without a tick."
