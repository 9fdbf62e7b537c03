"""Every cronbox table, registered on one metadata: what Alembic compares the migrations with.

Each family keeps its tables beside its code; this is the one place that names them all, so
`migrations/env.py` and the schema tests cannot miss a family. It lives in `cron` because the
scheduling and operator tables do (outbox never imports cron).
"""
from __future__ import annotations

import cron.operator.models  # noqa: F401
import cron.scheduling.models  # noqa: F401
import outbox.channels.models  # noqa: F401
from outbox.core.models import Base
import outbox.engine.models  # noqa: F401
import outbox.events.models  # noqa: F401
import outbox.queue.models  # noqa: F401
import storage.models  # noqa: F401

metadata = Base.metadata
