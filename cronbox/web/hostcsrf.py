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

A host route decorated with `cronbox.sealed_upload_route(csrf=csrf)` is exempted by the
decorator itself (`csrf.exempt`: no hook on the host's app), and gets the check
CSRFProtect would have made from `check_host_token`: the token from one of the host's
WTF_CSRF_HEADERS, or from its WTF_CSRF_FIELD_NAME field (or one whose name ends with it, as
Flask-WTF takes a prefixed form's) *before the file part* (cronbox.web.formstream reads the form only
that far), validated by Flask-WTF's public `validate_csrf`; a refusal is Flask-WTF's own
CSRFError, so the host's handler for it answers. Flask-WTF is imported only when the host's app
uses it. The check marks the request; seal_upload refuses a request with no mark on an app with
CSRFProtect (`refuse_unchecked`): the decorator written above the route decorator exempts the
bare view by its name and never runs.
"""
from __future__ import annotations

import logging

from flask import Blueprint, Request, current_app, has_app_context

from . import formstream
from .client import referrer_refusal

log = logging.getLogger("cronbox")

_METHODS = ("POST", "PUT", "PATCH", "DELETE")  # Flask-WTF's default WTF_CSRF_METHODS
CHECKED_KEY = "cronbox.host_csrf_checked"  # in the request's WSGI environ, once check_host_token ran


class CsrfNotChecked(RuntimeError):
    """seal_upload on an app with CSRFProtect in a request that `sealed_upload_route` never checked: a bug of
    the route, never the client's. `@sealed_upload_route(csrf=csrf)` written *above* `@app.post(...)`
    registers the bare view, which CSRFProtect still takes as exempt (by its name): no check at all would
    run. A 500 with this message, logged, nothing written."""


def host_protect():
    """The host app's Flask-WTF CSRFProtect, or None when it has none."""
    protect = current_app.extensions.get("csrf")
    if type(protect).__module__.startswith("flask_wtf") and callable(getattr(protect, "exempt", None)):
        return protect
    return None


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
    log.error("files: seal_upload in %s: the route has no CSRF check (sealed_upload_route missing, or above "
              "the route decorator); refused", req.endpoint)
    raise CsrfNotChecked(
        f"seal_upload: the request to {req.endpoint} was not CSRF-checked although the app has CSRFProtect. "
        "Put @cronbox.sealed_upload_route(csrf=<your CSRFProtect>) under the route decorator "
        "(@app.post(...) above it), so that the route registered is the checked one.")


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
    config = current_app.config
    if not config.get("WTF_CSRF_ENABLED", True) or req.method not in config.get("WTF_CSRF_METHODS", _METHODS):
        return
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
