"""The console's payload page (issue 40): masked, revealed only by an operator's POST with a reason,
which is audited with who, why and from where."""
from __future__ import annotations

import pytest

from cronbox.outbox.queue.jobs import job
from cronbox.storage import payload_reveal
from tests.console_helpers import PASSWORD, Operator, make_app
from cronbox.cron.operator import credentials

pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")
MARKER = "PHI-MARKER console"


@pytest.fixture
def app(runtime, env):
    application = make_app(env, runtime)
    yield application
    application.extensions["cronbox"].runtime.dispose()


def test_a_sealed_payload_is_masked_and_revealed_only_with_a_reason_and_audited(app, runtime, registry):
    @job("sms", name="console.sealed", sealed=True, registry=registry)
    def sealed(payload, ctx):
        pass

    with runtime.sessions.begin() as session:
        job_id = sealed.dispatch(session, {"text": MARKER})
    credentials.store_password(app.extensions["cronbox"].settings, PASSWORD, replace=False)
    anonymous = Operator(app)
    assert anonymous.get(f"/ops/payload/job/{job_id}").status_code == 302
    assert anonymous.post(f"/ops/payload/job/{job_id}", {"reason": "x"}, page="/ops/login").status_code == 401
    operator = Operator(app)
    assert operator.log_in().status_code == 303
    page = operator.get(f"/ops/payload/job/{job_id}").get_data(as_text=True)
    assert "sealed (" in page and MARKER not in page
    assert operator.post(f"/ops/payload/job/{job_id}", {"reason": "x"}, csrf=False).status_code == 400
    refused = operator.post(f"/ops/payload/job/{job_id}", {"reason": " "}).get_data(as_text=True)
    assert MARKER not in refused and "it is audited" in refused
    shown = operator.post(f"/ops/payload/job/{job_id}", {"reason": "patient called"})
    assert shown.status_code == 200 and MARKER in shown.get_data(as_text=True)
    with runtime.sessions() as session:
        [entry] = payload_reveal.revealed_entries(session, f"job:{job_id}")
    assert entry.detail.startswith("by console:") and "patient called" in entry.detail
    assert operator.get("/ops/payload/job/999999").status_code == 404
    assert operator.get("/ops/payload/file/1").status_code == 404
