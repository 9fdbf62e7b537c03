"""cronbox inside a Flask app: the extension and what a host's own routes use.

    from cronbox import Cronbox, seal_upload, sealed_upload_route, UploadRefused, upload_csrf_token

`Cronbox().init_app(app, db=db)` mounts the parts (sealed downloads and uploads under /files,
/health, the web-cron endpoint, the operator console under /ops), each a blueprint that can be
switched off or moved; see cronbox.extension. Domain code records events with `outbox.record`
and files with `storage.put`, as in the standalone app.
"""
from __future__ import annotations

from .extension import Cronbox
from .hostauth import upload_csrf_token
from .state import CronboxState, state
from .hostcsrf import CsrfNotChecked
from .uploads import BodyAlreadyRead, UploadRefused, seal_upload, sealed_upload_route

__all__ = ["BodyAlreadyRead", "Cronbox", "CsrfNotChecked", "CronboxState", "UploadRefused", "seal_upload", "sealed_upload_route", "state",
           "upload_csrf_token"]
