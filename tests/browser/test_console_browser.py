"""The operator console in a real browser: Debian's chromium driven by Playwright, against the app served
over real HTTP on loopback, with real ticks (`python -m cronbox tick` subprocesses) in between.

Screenshots of every page are saved under test-artifacts/console/<backend>/ (CRONBOX_TEST_ARTIFACTS
moves them). Without chromium the test skips with the reason; in CI (CI=1) that is a failure.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import select

import cronbox
from werkzeug.serving import make_server

from cronbox.outbox.core import clock
from cronbox.outbox.core.migrate import SCHEMA_HEAD
from cronbox.outbox.queue.models import Job
from tests.conftest import APP_ROOT, run_cli
from tests.console_helpers import PASSWORD, make_app
from tests.handlers import jobs as test_jobs
from tests.processes.test_queue_processes import dispatch, job_env  # noqa: F401  (fixture)
from cronbox.cron.operator import credentials

CHROMIUM = "/usr/bin/chromium"
# What a browser does with the console's pages: the server behind the rows changes nothing, so not
# PostgreSQL too (.ci/run's 30 minutes; the console's queries run on it in tests/web/test_console.py).
pytestmark = pytest.mark.backends("sqlite", "mysql-skip-locked")


def _need_browser():
    problem = None
    if not Path(CHROMIUM).exists():
        problem = f"{CHROMIUM} is missing (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "the playwright package is not installed"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests required in CI but {problem}")
        pytest.skip(f"browser tests skipped: {problem}")


@pytest.fixture
def artifacts(backend) -> Path:
    folder = Path(os.environ.get("CRONBOX_TEST_ARTIFACTS") or APP_ROOT / "test-artifacts") / "console" / backend
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def slow_bodies(application):
    """The app with every page's body sent in two parts half a second apart: the browser has the new URL
    and the start of the page, not its heading yet. A check that reads the page before it is whole
    fails here every time, not once in a while on a loaded CI machine."""
    def app(environ, start_response):
        response = application(environ, start_response)
        try:
            body = b"".join(response)
        finally:
            getattr(response, "close", lambda: None)()  # a WSGI middleware closes what it iterated
        yield body[:60]
        time.sleep(0.5)
        yield body[60:]
    return app


@pytest.fixture
def server(runtime, job_env, backend):
    """The app (consumers and jobs of tests.handlers.jobs) on a real loopback HTTP server; on SQLite its
    pages arrive slowly (slow_bodies), on MariaDB promptly."""
    application = make_app(job_env, runtime, CRONBOX_HANDLERS="tests.handlers.jobs")
    served = slow_bodies(application) if backend == "sqlite" else application
    http = make_server("127.0.0.1", 0, served, threaded=True)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield application, f"http://127.0.0.1:{http.server_port}"
    finally:
        http.shutdown()
        thread.join(10)
        application.extensions["cronbox"].runtime.dispose()


@pytest.fixture
def page(backend):
    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = context.new_page()
        tab.set_default_timeout(15000)
        yield tab
        context.close()
        browser.close()


def tick(job_env) -> None:
    done = run_cli({**job_env, "CRONBOX_HANDLERS": "tests.handlers.jobs"}, "tick", "--no-linger", "--max-time", "60")
    assert done.returncode == 0, done.stderr


def fetch(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def unlabelled(page) -> list[str]:
    """Form controls without a label (or an aria-label, or a button's own text)."""
    return page.evaluate("""() => [...document.querySelectorAll('input:not([type=hidden]), button, select')]
        .filter(el => !((el.labels && el.labels.length > 0) || el.getAttribute('aria-label') || el.textContent.trim()))
        .map(el => el.outerHTML)""")


def arrived(page, heading: str, level: int = 1) -> None:
    """Wait until the page a click navigates to is shown, by its heading: a click only waits for the
    navigation to start, and a check made before it ends reads the old page (or fails as its document
    goes away). Every check after a navigation waits for it here or retries (Playwright's expect)."""
    from playwright.sync_api import expect

    expect(page.get_by_role("heading", name=heading, level=level)).to_be_visible()
    page.wait_for_load_state("load")


def shoot(page, artifacts: Path, name: str) -> None:
    """A screenshot of the page shown now; the caller has waited for it (arrived(), or a retrying expect)."""
    assert unlabelled(page) == [], name
    assert page.evaluate("() => document.querySelectorAll('script').length") == 0
    page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)


def test_operator_walkthrough(server, page, runtime, job_env, artifacts):
    from playwright.sync_api import expect

    app, base = server
    settings = app.extensions["cronbox"].settings

    # A fresh install sends the operator to setup, which wants the token from the instance folder.
    page.goto(f"{base}/ops/")
    assert page.url.endswith("/ops/setup")
    shoot(page, artifacts, "setup")
    page.get_by_label("Setup token").fill(credentials.token_file(settings).read_text().strip())
    page.get_by_label("New password (at least 12 characters)").fill(PASSWORD)
    page.get_by_label("New password again").fill(PASSWORD)
    page.get_by_role("button", name="Set password").click()
    expect(page).to_have_url(f"{base}/ops/")
    arrived(page, "Overview")

    # Log out and back in with the new password (a wrong one first).
    page.get_by_role("button", name="Log out").click()
    page.get_by_label("Operator password").fill("not the password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_have_text("Wrong password.")
    arrived(page, "Log in")
    shoot(page, artifacts, "login")
    page.get_by_label("Operator password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{base}/ops/")

    # A failed job: seen, retried, gone after a tick (the job then succeeds).
    dispatch(runtime, test_jobs.write.job, 1)
    with runtime.sessions.begin() as session:
        job = session.scalars(select(Job)).one()
        job.status, job.available_at, job.attempts = "failed", None, 3
        job.last_error, job.error_class, job.finished_at = "gateway timed out", "TimeoutError", clock.utcnow()
        job_id, trace_id = job.id, job.trace_id
    page.get_by_role("link", name="Queues").click()
    arrived(page, "Queues")
    row = page.locator(f"#job-{job_id}")
    expect(row).to_contain_text("TimeoutError: gateway timed out")
    expect(row).to_contain_text(trace_id)
    shoot(page, artifacts, "queues")
    row.get_by_role("button", name=f"Retry job {job_id}").click()
    expect(page.get_by_role("status")).to_contain_text("1 jobs queued again")
    tick(job_env)
    page.reload()
    expect(page.get_by_text("No failed jobs.")).to_be_visible()
    expect(page.locator(f"#job-{job_id}")).to_have_count(0)
    with runtime.sessions() as session:
        assert session.get(Job, job_id).status == "done"

    # A batch: its progress, its members by state, cancelled from its page (asks first).
    with runtime.sessions.begin() as session:
        reminders = cronbox.batch(session, name="reminders 2026-12-01")
        for n in range(3):
            test_jobs.write.dispatch(session, {"n": n}, batch=reminders)
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Batches").click()
    arrived(page, "Batches")
    expect(page.locator(f"#batch-{reminders.id}")).to_contain_text("reminders 2026-12-01")
    shoot(page, artifacts, "batches")
    page.get_by_role("link", name=f"#{reminders.id}").click()
    expect(page.locator("#batch-progress")).to_contain_text("pending 3 of 3")
    page.get_by_role("link", name="ready", exact=True).click()
    arrived(page, "Members ready", level=2)
    expect(page.locator("tr[id^=member-]")).to_have_count(3)
    shoot(page, artifacts, "batch")
    page.get_by_role("button", name="Cancel the batch…").click()
    page.get_by_role("button", name="Cancel the batch", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("3 members not started stopped")
    expect(page.locator("#batch-progress")).to_contain_text("cancelled 3, pending 0 of 3")

    # migrate as a one-off run: pending, then its output after a tick.
    page.get_by_role("link", name="One-off runs").click()
    page.get_by_label("Command").fill("migrate")
    page.get_by_role("button", name="Run at the next tick").click()
    expect(page.get_by_role("status")).to_contain_text("is pending")
    tick(job_env)
    page.reload()
    arrived(page, "One-off runs")
    shoot(page, artifacts, "once")
    page.locator("table a", has_text="#").first.click()
    arrived(page, "One-off run #")
    expect(page.locator("#exit-code")).to_have_text("0")
    expect(page.locator("#output")).to_have_text(f"migrate: already at {SCHEMA_HEAD}")
    shoot(page, artifacts, "once-run")

    # A file uploaded from the Files page, sealed as it arrives; a grant to it revoked in the console:
    # its link is refused at once.
    page.get_by_role("navigation").get_by_role("link", name="Files").click()
    page.get_by_text("Upload a file").click()
    page.get_by_label("Owner").fill("patient:1")
    page.get_by_label("File", exact=True).set_input_files(files=[{"name": "lab.pdf", "mimeType": "application/pdf",
                                                      "buffer": b"%PDF lab result"}])
    page.get_by_role("button", name="Seal and store").click()
    expect(page.get_by_role("status")).to_contain_text("Sealed as file")
    file_id = page.url.rsplit("=", 1)[1]
    store = app.extensions["cronbox"].storage
    with runtime.sessions.begin() as session:
        grant_id = store.grant(session, file_id, "doctor:2")
    link = store.signed_url(grant_id, ttl=600)
    download = base + link[link.index("/files/"):]
    assert fetch(download) == 200
    page.get_by_role("navigation").get_by_role("link", name="Files").click()
    expect(page.get_by_role("button", name=f"Revoke grant {grant_id}")).to_be_visible()  # not on the page before
    arrived(page, "Files")
    shoot(page, artifacts, "files")
    page.get_by_role("button", name=f"Revoke grant {grant_id}").click()
    arrived(page, "Revoke grant?")
    shoot(page, artifacts, "confirm")
    page.get_by_role("button", name="Revoke", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text(f"Grant {grant_id} revoked.")
    assert fetch(download) == 404
    assert "lab.pdf" not in page.content() and "/files/" not in page.content()

    for name in ("Overview", "Outbox", "Schedule", "Activity"):
        page.get_by_role("navigation").get_by_role("link", name=name, exact=True).click()
        arrived(page, name)
        shoot(page, artifacts, name.lower())
    assert "files.revoke" in page.content() and "queue.retry" in page.content()

    # Readable on a phone: nothing wider than the screen but the scrolling tables; keyboard first stop.
    page.set_viewport_size({"width": 375, "height": 740})
    page.get_by_role("navigation").get_by_role("link", name="Overview").click()
    arrived(page, "Overview")
    wide = page.evaluate("""() => [...document.querySelectorAll('body *')]
        .filter(e => e.getBoundingClientRect().right > 376 && !e.closest('.scroll'))
        .map(e => e.tagName + '.' + e.className + ' ' + e.textContent.slice(0, 40))""")
    assert wide == [] and page.evaluate("() => document.documentElement.scrollWidth") <= 375
    shoot(page, artifacts, "overview-phone")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent") == "Skip to content"
    assert sorted(p.name for p in artifacts.iterdir()) == sorted(
        f"{n}.png" for n in ["setup", "login", "queues", "batches", "batch", "once", "once-run", "files", "confirm", "overview", "outbox",
                             "schedule", "activity", "overview-phone"])
