"""cronbox inside a Flask app: the extension and what a host's own routes use.

    from cronbox import Cronbox, seal_upload, sealed_upload_route, UploadRefused, upload_csrf_token

`Cronbox().init_app(app, db=db)` mounts the parts (sealed downloads and uploads under /files,
/health, the web-cron endpoint, the operator console under /ops), each a blueprint that can be
switched off or moved; see cronbox.extension. Domain code records events with
`cronbox.outbox.record` and files with `cronbox.storage.put`, as in the standalone app.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .extension import Cronbox
    from .hostauth import upload_csrf_token
    from .hostcsrf import CsrfNotChecked
    from .uploads import BodyAlreadyRead, UploadRefused, seal_upload, sealed_upload_route

# Each public name and the module that defines it, imported on first use (PEP 562): every cronbox
# process imports this package first (`python -m cronbox tick`, `import cronbox.outbox...`), and a
# tick has no use for Flask, which the web parts below import (~17 MB and a tenth of a second).
# An app's state (`cronbox.state.state(app)`) is internal, and not here: `state` is also that module's name.
_EXPORTS = {
    "BodyAlreadyRead": ".uploads",
    "Cronbox": ".extension",
    "CsrfNotChecked": ".hostcsrf",
    "UploadRefused": ".uploads",
    "seal_upload": ".uploads",
    "sealed_upload_route": ".uploads",
    "upload_csrf_token": ".hostauth",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cronbox' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
