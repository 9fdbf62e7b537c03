"""Keeping a host's app-wide CSRF check (Flask-WTF's CSRFProtect) off cronbox's own routes and off the
host's sealed-upload routes, and doing its check for the latter without reading the file.

A host's CSRFProtect guards every POST of its app from an app-wide before_request. On
cronbox's routes it would refuse the console's forms (they carry the console's own token,
cronbox.web.ops.csrf), POST /files with a bearer token and POST /cron/tick (never sent by a
browser on its own, so CSRF does not apply), and it would read an upload's body as a form
before cronbox streams and seals it. So each cronbox blueprint that takes POSTs asks the
host's CSRFProtect, when there is one, to leave that blueprint alone: from a
url_value_preprocessor, the only hook of a blueprint that runs before the app's own
before_request functions, so the order of `csrf.init_app(app)` and `cronbox.init_app(app)`
does not matter. The host's own routes stay protected exactly as before.

A host route decorated with `cronbox.sealed_upload_route` is the host's, not in a blueprint of
ours, and CSRFProtect reading its form would spool the file part to a plaintext temporary file.
The host's CSRFProtect is found in `app.extensions["csrf"]` (where Flask-WTF puts it), in
whichever order the host set things up, by a receiver of Flask's `request_started` signal for
the app (`watch_requests`, connected by init_app): it runs before any url_value_preprocessor or
before_request of the app and adds no hook to the app itself. For a request to a checking
wrapper it asks CSRFProtect to leave that view alone (its public `exempt`). Flask-WTF keys an
exempt view by `module.function`, and the wrapper keeps the host view's name (Flask makes the
endpoint from it), so the wrapper gets a `__module__` of its own (`take_over`): a name no
importable module has, one per decorated view, so the exemption can never reach another view
(a host form view of the same function name in the same module keeps its check). The one view
left out is the bare view a decorator written *above* the route decorator wrapped (the route
registered it, not the wrapper): exempting it would exempt it by the host's own names, so the
request is refused instead (CsrfNotChecked, a 500, logged) before anything reads its body.

The wrapper makes the check CSRFProtect would have made, in `check_host_token`: the token from
one of the host's WTF_CSRF_HEADERS, or from its WTF_CSRF_FIELD_NAME field (or one whose name
ends with it, as Flask-WTF takes a prefixed form's) *before the file part* (cronbox.web.formstream
reads the form only that far), validated by Flask-WTF's public `validate_csrf`; a refusal is
Flask-WTF's own CSRFError, so the host's handler for it answers. Flask-WTF is imported only
when the host's app uses it. The check marks the request; seal_upload refuses a request with no
mark on an app with CSRFProtect (`refuse_unchecked`): a view that calls seal_upload without the
decorator, or that the host exempted itself, never seals unchecked.
"""
from __future__ import annotations

import itertools
import logging
import weakref
from typing import Callable

from flask import Blueprint, Flask, Request, current_app, has_app_context, request, request_started

from . import formstream
from .client import referrer_refusal

log = logging.getLogger("cronbox")

_METHODS = ("POST", "PUT", "PATCH", "DELETE")  # Flask-WTF's default WTF_CSRF_METHODS
CHECKED_KEY = "cronbox.host_csrf_checked"  # in the request's WSGI environ, once check_host_token ran
CHECKING_VIEW = "cronbox_checks_host_csrf"  # set on the checking wrapper; functools.wraps above it copies it
_wrapper_numbers = itertools.count(1)
_wrapped_views: weakref.WeakSet = weakref.WeakSet()  # the views sealed_upload_route wrapped


class CsrfNotChecked(RuntimeError):
    """seal_upload on an app with CSRFProtect in a request that `sealed_upload_route` never checked: a bug of
    the route, never the client's. `@sealed_upload_route` written *above* `@app.post(...)`
    registers the bare view: no check at all would run. A 500 with this message, logged, before anything
    reads the request's body (or, in a view that calls seal_upload unchecked, nothing written)."""


def host_protect():
    """The host app's Flask-WTF CSRFProtect, or None when it has none."""
    protect = current_app.extensions.get("csrf")
    if type(protect).__module__.startswith("flask_wtf") and callable(getattr(protect, "exempt", None)):
        return protect
    return None


def take_over(wrapper: Callable, view: Callable) -> None:
    """Make `wrapper` (sealed_upload_route's check around `view`) a view CSRFProtect can exempt alone.

    Its `__module__` becomes one no importable module can have ("clinic.views (cronbox
    sealed_upload_route 3)"), since Flask-WTF keys an exempt view by `module.function` and
    the function name must stay the host's (Flask's default endpoint). `view` is remembered (weakly)
    to refuse a request that reaches it registered bare."""
    wrapper.__module__ = f"{getattr(view, '__module__', None)} (cronbox sealed_upload_route {next(_wrapper_numbers)})"
    setattr(wrapper, CHECKING_VIEW, True)
    try:
        _wrapped_views.add(view)
    except TypeError:  # a callable that takes no weak reference: never a plain view function
        pass


def watch_requests(app: Flask) -> None:
    """Connect `leave_uploads_to_cronbox` for `app` (a weak reference to the app: nothing kept alive)."""
    request_started.connect(leave_uploads_to_cronbox, app)


def leave_uploads_to_cronbox(app: Flask, **_extra) -> None:
    """Before CSRFProtect's check: exempt this request's view when it is a checking wrapper (or a host
    decorator's functools.wraps around one); refuse it when it is a view such a wrapper wrapped,
    registered bare, before anything reads its body."""
    view = app.view_functions.get(request.endpoint) if request.endpoint else None
    if view is None:
        return
    protect = host_protect()
    if protect is None:
        return
    if getattr(view, CHECKING_VIEW, False):
        protect.exempt(view)  # a set: again costs nothing
    elif view in _wrapped_views and _csrfprotect_checks(request):
        _refuse(request)


def exempt_from_host_csrf(bp: Blueprint) -> None:
    @bp.url_value_preprocessor
    def _leave_to_cronbox(endpoint, values) -> None:
        protect = host_protect()
        if protect is not None:
            protect.exempt(bp)  # a set: once is enough, again costs nothing


def check_host_token(req: Request) -> None:
    """Flask-WTF's CSRF check of this request, made without reading the body past the file part's
    headers; flask_wtf.csrf.CSRFError when it fails. Nothing to check without CSRFProtect on the app.
    A request that passed is marked (CHECKED_KEY) for `refuse_unchecked`."""
    _check(req)
    req.environ[CHECKED_KEY] = True


def refuse_unchecked(req: Request) -> None:
    """CsrfNotChecked, logged, when the app has CSRFProtect and check_host_token did not pass this request."""
    if req.environ.get(CHECKED_KEY) or not has_app_context() or host_protect() is None:
        return
    _refuse(req)


def _refuse(req: Request) -> None:
    log.error("files: seal_upload in %s: the route has no CSRF check (sealed_upload_route missing, or above "
              "the route decorator); refused", req.endpoint)
    raise CsrfNotChecked(
        f"seal_upload: the request to {req.endpoint} was not CSRF-checked although the app has CSRFProtect. "
        "Put @cronbox.sealed_upload_route under the route decorator (@app.post(...) above it), so that the "
        "route registered is the checked one.")


def _csrf_applies(req: Request) -> bool:
    """Whether the host's CSRF settings ask for a token on this request."""
    config = current_app.config
    return bool(config.get("WTF_CSRF_ENABLED", True)) and req.method in config.get("WTF_CSRF_METHODS", _METHODS)


def _csrfprotect_checks(req: Request) -> bool:
    """Whether the app's CSRFProtect checks this request from its before_request (and so reads its form)."""
    return _csrf_applies(req) and bool(current_app.config.get("WTF_CSRF_CHECK_DEFAULT", True))


def _token_field(req: Request, field: str) -> str | None:
    """Flask-WTF's choice of token field, among the fields before the file part: `field` itself, else the
    first non-empty one whose name ends with it (a FlaskForm(prefix="scan") sends "scan-csrf_token")."""
    fields = formstream.fields_before_file(req)
    if fields.get(field):
        return fields[field]
    return next((value for name, value in fields.items(multi=True) if name.endswith(field) and value), None)


def _check(req: Request) -> None:
    if host_protect() is None:
        return
    if not _csrf_applies(req):
        return
    config = current_app.config
    from flask_wtf.csrf import CSRFError, validate_csrf
    from wtforms import ValidationError

    headers = config.get("WTF_CSRF_HEADERS", ["X-CSRFToken", "X-CSRF-Token"])
    field = config.get("WTF_CSRF_FIELD_NAME", "csrf_token")
    token = next((req.headers[name] for name in headers if req.headers.get(name)), None)
    if token is None:
        try:
            token = _token_field(req, field)
        except ValueError as exc:  # the decoder's, or formstream.FormError
            raise CSRFError(f"The form is malformed: {exc}.") from None
    if not token:
        raise CSRFError(f"The CSRF token is missing: send it in the {field} field before the file, "
                        f"or in the {headers[0]} header.")
    try:
        validate_csrf(token)
    except ValidationError as exc:
        raise CSRFError(exc.args[0]) from None
    if config.get("WTF_CSRF_SSL_STRICT", True):
        refusal = referrer_refusal(req, current_app.extensions["cronbox"].settings.trusted_proxies)
        if refusal:
            raise CSRFError(refusal)
