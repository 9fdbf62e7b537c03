"""The operator console under Flask's test client: an app per test, a logged-in operator, CSRF tokens."""
from __future__ import annotations

import re

from app import create_app
from cronbox.cron.operator import credentials
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.registry import DEFAULT, Registry
from tests.registries import copy_of

PASSWORD = "correct horse battery staple"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
GET_PAGES = ["/ops/", "/ops/outbox", "/ops/queues", "/ops/schedule", "/ops/once", "/ops/files", "/ops/activity",
             "/ops/once/1", "/ops/batches", "/ops/batches/1"]
POST_ACTIONS = ["/ops/outbox/retry", "/ops/outbox/skip", "/ops/queues/retry", "/ops/queues/forget",
                "/ops/queues/flush", "/ops/queues/resume", "/ops/schedule/run", "/ops/once", "/ops/files/revoke", "/ops/batches/retry", "/ops/batches/cancel", "/ops/logout",
                "/ops/logout-everywhere"]


def make_app(env: dict, runtime=None, **extra):
    application = create_app(load_settings(environ={**env, **extra}))
    application.testing = True
    if runtime is not None:
        application.extensions["cronbox"].runtime.registry = registry_with_consumers_of(runtime)
    return application


def registry_with_consumers_of(runtime) -> Registry:
    """cronbox's own registrations (built-in tasks, channel jobs) with the consumers the test registered."""
    registry = copy_of(DEFAULT)
    registry.consumers = runtime.registry.consumers
    return registry


def csrf_token(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF token in the page"
    return match.group(1)


UPLOAD_FORM = re.compile(r'<form method="post" action="([^"?]+/upload)" enctype="multipart/form-data"[^>]*>\s*'
                         r'<input type="hidden" name="csrf_token" value="([^"]+)">')


def upload_form(html: str) -> tuple[str, str]:
    """The Files page's upload form: its action (no token in it) and the token, its first field (before the file)."""
    match = UPLOAD_FORM.search(html)
    assert match, "no upload form with the CSRF token as its first field in the page"
    return match.group(1), match.group(2)


class Operator:
    """A browser-like client: keeps cookies, fetches a CSRF token from a page before each POST.
    `base`: where the console is mounted (CRONBOX_OPS_PREFIX + /ops); `environ`: WSGI environ for every
    request (REMOTE_ADDR, HTTP_X_FORWARDED_PROTO, HTTP_REFERER, ...)."""

    def __init__(self, app, *, base: str = "/ops", client=None, **environ):
        self.app = app
        self.base = base
        self.client = client or app.test_client()
        self.environ = environ

    def get(self, path: str, **kwargs):
        return self.client.get(path, environ_base=self.environ, **kwargs)

    def token(self, page: str | None = None) -> str:
        return csrf_token(self.get(page or f"{self.base}/login").get_data(as_text=True))

    def post(self, path: str, data: dict | None = None, *, page: str | None = None, csrf: bool = True, **kwargs):
        form = dict(data or {})
        if csrf:
            form["csrf_token"] = self.token(page or f"{self.base}/")
        return self.client.post(path, data=form, environ_base=self.environ, **kwargs)

    def set_up(self, password: str = PASSWORD):
        page = self.get(f"{self.base}/setup").get_data(as_text=True)
        token = credentials.token_file(self.app.extensions["cronbox"].settings).read_text().strip()
        return self.client.post(f"{self.base}/setup", environ_base=self.environ,
                                data={"csrf_token": csrf_token(page), "token": token, "password": password,
                                      "confirm_password": password})

    def log_in(self, password: str = PASSWORD):
        return self.post(f"{self.base}/login", {"password": password}, page=f"{self.base}/login")


def logged_in(app, **kwargs) -> Operator:
    operator = Operator(app, **kwargs)
    response = operator.set_up()
    assert response.status_code == 303, response.get_data(as_text=True)
    return operator
