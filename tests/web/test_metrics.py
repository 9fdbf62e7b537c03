"""GET /metrics: the Prometheus text format read back by prometheus_client's own parser, with the values
seeded here, in the standalone app and inside a host app; the token, the switch and the 503."""
from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from prometheus_client.parser import text_string_to_metric_families

from cronbox.cron.scheduling import metrics
from cronbox import Cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.engine.models import Heartbeat
from cronbox.outbox.events.models import DEAD, PENDING, Delivery, OutboxEvent
from cronbox.outbox.queue.models import FAILED, READY, RESERVED, Job
from tests.conftest import ONE_MYSQL_MODE
from tests.console_helpers import make_app

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)

T0 = datetime(2026, 11, 30, 12, 0, 0)
TOKEN = "metrics-" + "m" * 24
ODD = 'mail "ops"\\team\nB'  # a consumer name that needs every label escape


def seed(runtime) -> None:
    s = lambda seconds: T0 + timedelta(seconds=seconds)  # noqa: E731
    with runtime.sessions.begin() as session:
        def event(**fanned):
            row = OutboxEvent(type="paid", key=None, payload="{}", trace_id="t" * 32, created_at=s(-600),
                              available_at=s(-600), **fanned)
            session.add(row)
            session.flush()
            return row.id

        event()  # not fanned out yet
        rows = [("billing", PENDING, -120), ("billing", PENDING, -30), ("billing", PENDING, 600),
                ("billing", DEAD, -900), (ODD, DEAD, -900), (ODD, DEAD, -800)]
        session.add_all([Delivery(event_id=event(fanned_out_at=s(-600)), consumer=c, status=st, next_attempt_at=s(at),
                                  created_at=s(-600), attempts=1 if st == DEAD else 0) for c, st, at in rows])
        jobs = [("sms", READY, -45), ("sms", READY, 60), ("sms", RESERVED, 30), ("sms", FAILED, None),
                ("sms", FAILED, None), ("mail", FAILED, None)]
        session.add_all([Job(queue=q, handler="h", payload="{}", status=st, available_at=s(at) if at is not None else None,
                             trace_id="j" * 32, created_at=s(-600)) for q, st, at in jobs])
        beats = [("tick", -7200, 3.0, "empty", (100, 0, 0, 100, 0)),  # outside the hour: not summed
                 ("tick", -3000, 2.5, "max-time", (3, 1, 0, 4, 1)),
                 ("tick", -600, 1.25, "empty", (2, 0, 1, 1, 0)),
                 ("tick", -30, None, "running", (0, 0, 0, 0, 0)),
                 ("work", -300, 4.0, "empty", (0, 0, 0, 7, 2))]
        for command, at, took, outcome, (delivered, retried, dead, done, failed) in beats:
            session.add(Heartbeat(command=command, host="h", pid=1, started_at=s(at), outcome=outcome,
                                  finished_at=s(at + took) if took is not None else None, delivered=delivered,
                                  retried=retried, dead=dead, jobs_done=done, jobs_failed=failed))


def samples(text: str) -> dict[tuple, float]:
    """{(name, ((label, value), ...)): value} from the reference parser, which also checks HELP/TYPE.
    Every family and its labels are metrics.FAMILIES' (the documented ones, docs/reference/metrics.md)."""
    out = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge" and family.documentation, family.name
        for sample in family.samples:
            assert tuple(sample.labels) == metrics.FAMILIES[family.name][0], (family.name, sample.labels)
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def check_seeded_values(text: str) -> None:
    got = samples(text)

    def value(name, **labels):
        return got[(name, tuple(sorted(labels.items())))]

    assert value("cronbox_outbox_pending", consumer="billing") == 3
    assert value("cronbox_outbox_due", consumer="billing") == 2
    assert value("cronbox_outbox_oldest_due_age_seconds", consumer="billing") == 120
    assert value("cronbox_outbox_dead", consumer="billing") == 1
    assert value("cronbox_outbox_dead", consumer=ODD) == 2  # escaped on the way out, the same name read back
    assert value("cronbox_outbox_oldest_due_age_seconds", consumer=ODD) == 0
    assert value("cronbox_outbox_unfanned_events") == 1
    assert [value("cronbox_jobs", queue="sms", state=st) for st in ("ready", "delayed", "reserved", "failed")] == [1, 1, 1, 2]
    assert value("cronbox_jobs", queue="mail", state="failed") == 1
    assert value("cronbox_jobs", queue="empty", state="ready") == 0  # a configured queue with no jobs: zeros
    assert value("cronbox_jobs_oldest_ready_age_seconds", queue="sms") == 45
    assert value("cronbox_handled", command="tick", outcome="delivered") == 5
    assert value("cronbox_handled", command="tick", outcome="jobs_done") == 5
    assert value("cronbox_handled", command="tick", outcome="jobs_failed") == 1
    assert value("cronbox_handled", command="work", outcome="jobs_done") == 7
    assert value("cronbox_runs", command="tick", outcome="max-time") == 1
    assert value("cronbox_runs", command="tick", outcome="running") == 1
    assert ("cronbox_runs", (("command", "tick"), ("outcome", "empty"))) in got
    assert value("cronbox_runs", command="tick", outcome="empty") == 1  # the one two hours ago is outside
    assert value("cronbox_metrics_window_seconds") == 3600
    assert value("cronbox_last_run_age_seconds", command="tick") == 30
    assert value("cronbox_last_run_duration_seconds", command="tick") == 1.25  # the running one has none yet
    assert value("cronbox_last_run_age_seconds", command="work") == 300
    assert value("cronbox_last_run_duration_seconds", command="work") == 4
    assert not [key for key in got if ("command", "publish") in key[1]]  # never ran: no made-up line
    assert ("cronbox_last_run_age_seconds", (("command", "work"),)) in got
    assert all(name.startswith("cronbox_") for name, _ in got)


def scrape(client, path="/metrics", token=TOKEN):
    with clock.frozen(T0):
        return client.get(path, headers={"Authorization": f"Bearer {token}"} if token else {})


def test_standalone_metrics_parse_and_match_what_was_seeded(env, runtime):
    seed(runtime)
    client = make_app(env, runtime, CRONBOX_METRICS_TOKEN=TOKEN, CRONBOX_QUEUES="sms,mail,empty").test_client()
    response = scrape(client)
    assert response.status_code == 200, response.data
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert response.headers["Cache-Control"] == "no-store"
    check_seeded_values(response.get_data(as_text=True))


def test_group_slot_use_and_budgets_parse(env, runtime):
    from cronbox.outbox.queue import groups
    from cronbox.outbox.queue.jobs import job

    app = make_app(env, runtime, CRONBOX_METRICS_TOKEN=TOKEN, CRONBOX_GROUP_BUDGETS="providers=100/m",
                   CRONBOX_QUEUE_BUDGETS="sms=5/10s")
    job("sms", name="provider.send", concurrency_group="providers", concurrency_limit=3,
        registry=app.extensions["cronbox"].runtime.registry)(lambda payload, ctx: None)
    with runtime.sessions.begin() as session:
        session.add_all([Job(queue="sms", handler="provider.send", payload="{}", status=READY, available_at=T0,
                             trace_id="j" * 32, created_at=T0) for _ in range(4)])
        session.add(Job(queue="sms", handler="other", payload="{}", status=READY, available_at=T0, trace_id="k" * 32,
                        created_at=T0, concurrency_group="providers"))
        for holder in ("a", "b"):
            assert groups.take(session, "providers", 3, holder, T0 + timedelta(seconds=30), T0) is None
        groups.take(session, "undeclared", 1, "c", T0 + timedelta(seconds=30), T0)
        groups.take(session, "stale", 1, "d", T0 - timedelta(seconds=1), T0 - timedelta(seconds=60))
        groups.budgets(app.extensions["cronbox"].runtime.settings)[("group", "providers")].charge(session, 7, T0)
    response = scrape(app.test_client())
    assert response.status_code == 200
    got = samples(response.get_data(as_text=True))
    assert got[("cronbox_group_limit", (("group", "providers"),))] == 3
    assert got[("cronbox_group_slots_in_use", (("group", "providers"),))] == 2
    assert got[("cronbox_group_waiting", (("group", "providers"),))] == 5
    assert got[("cronbox_group_slots_in_use", (("group", "undeclared"),))] == 1
    assert ("cronbox_group_limit", (("group", "undeclared"),)) not in got
    assert ("cronbox_group_slots_in_use", (("group", "stale"),)) not in got  # its lease ended: nothing held
    assert got[("cronbox_budget_used", (("name", "providers"), ("scope", "group")))] == 7
    assert got[("cronbox_budget_limit", (("name", "sms"), ("scope", "queue")))] == 5
    assert got[("cronbox_budget_window_seconds", (("name", "sms"), ("scope", "queue")))] == 10
    assert got[("cronbox_budget_used", (("name", "sms"), ("scope", "queue")))] == 0


def test_a_wrong_or_missing_token_gets_no_numbers(env, runtime):
    seed(runtime)
    client = make_app(env, runtime, CRONBOX_METRICS_TOKEN=TOKEN).test_client()
    missing = scrape(client, token=None)
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    for header in ("Bearer wrong", f"Basic {TOKEN}", TOKEN, "Bearer "):
        with clock.frozen(T0):
            refused = client.get("/metrics", headers={"Authorization": header})
        assert refused.status_code in (401, 403) and b"cronbox_" not in refused.data, header
    assert client.get(f"/metrics?token={TOKEN}").status_code == 401  # never from the URL
    assert scrape(client, token="x" + TOKEN).status_code == 403


def test_the_health_token_serves_when_no_metrics_token_is_set_and_none_means_no_endpoint(env, runtime):
    seed(runtime)
    health_only = make_app(env, runtime, CRONBOX_HEALTH_TOKEN=TOKEN).test_client()
    assert scrape(health_only).status_code == 200
    own = make_app(env, runtime, CRONBOX_HEALTH_TOKEN="health-" + "h" * 24, CRONBOX_METRICS_TOKEN=TOKEN).test_client()
    assert scrape(own).status_code == 200 and scrape(own, token="health-" + "h" * 24).status_code == 403
    assert scrape(make_app(env, runtime).test_client()).status_code == 404


def test_inside_a_host_app_moved_and_switched_off(database, runtime, tmp_path):
    seed(runtime)

    def host(**config):
        app = Flask("clinic", root_path=str(tmp_path), instance_path=str(tmp_path / "host-instance"))
        app.config.update(CRONBOX_HANDLERS="", CRONBOX_METRICS_TOKEN=TOKEN, CRONBOX_QUEUES="sms,mail,empty",
                          SQLALCHEMY_DATABASE_URI=database.url, **config)
        db = SQLAlchemy()
        db.init_app(app)
        state = Cronbox().init_app(app, db=db)
        return app, state

    app, state = host(CRONBOX_METRICS_PREFIX="/monitoring")
    client = app.test_client()
    assert scrape(client).status_code == 404
    response = scrape(client, "/monitoring/metrics")
    assert response.status_code == 200
    check_seeded_values(response.get_data(as_text=True))
    state.runtime.dispose()
    off, _ = host(CRONBOX_METRICS="off")
    assert scrape(off.test_client()).status_code == 404
    with pytest.raises(SettingsError, match="CRONBOX_METRICS_WINDOW"):
        host(CRONBOX_METRICS_WINDOW="5s")


def test_a_window_setting_changes_what_is_summed(env, runtime):
    seed(runtime)
    client = make_app(env, runtime, CRONBOX_METRICS_TOKEN=TOKEN, CRONBOX_METRICS_WINDOW="3h").test_client()
    got = samples(scrape(client).get_data(as_text=True))
    assert got[("cronbox_handled", (("command", "tick"), ("outcome", "delivered")))] == 105
    assert got[("cronbox_metrics_window_seconds", ())] == 3 * 3600



def test_database_down_is_a_503_line(tmp_path):
    from app import create_app
    from cronbox.outbox.core.settings import load_settings

    settings = load_settings(environ={"DATABASE_URL": "mysql+pymysql://root:@127.0.0.1:9/none",
                                      "CRONBOX_INSTANCE": str(tmp_path / "instance"), "CRONBOX_HANDLERS": "",
                                      "CRONBOX_METRICS_TOKEN": TOKEN})
    response = create_app(settings).test_client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 503 and response.get_data(as_text=True) == "database unavailable\n"


def test_the_text_format_escapes_and_numbers():
    family = metrics.Family("cronbox_x", "gauge", "a \\ help\nline")
    family.add(1.5, name='a"b\\c\nd')
    family.add(float("nan"), name="n")
    family.add(3, name="i")
    text = metrics.render([family, metrics.Family("cronbox_empty", "gauge", "none yet")])
    assert text.splitlines()[:3] == ["# HELP cronbox_x a \\\\ help\\nline", "# TYPE cronbox_x gauge",
                                     'cronbox_x{name="a\\"b\\\\c\\nd"} 1.5']
    assert 'cronbox_x{name="i"} 3' in text and text.endswith("# TYPE cronbox_empty gauge\n")
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    assert parsed["cronbox_x"].samples[0].labels == {"name": 'a"b\\c\nd'}
    assert parsed["cronbox_x"].documentation == "a \\ help\nline"
    assert json.dumps(sorted(parsed)) == '["cronbox_empty", "cronbox_x"]'
