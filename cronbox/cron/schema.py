"""Every cronbox table, registered on one metadata: what Alembic compares the migrations with.

Each family keeps its tables beside its code; this is the one place that names them all, so
`migrations/env.py` and the schema tests cannot miss a family. It lives in `cron` because the
scheduling and operator tables do (outbox never imports cron).

It also draws the line between cronbox's tables and the host app's in a shared database: every
table whose name starts with `cronbox_` (the version table `cronbox_alembic_version` too) is
cronbox's, migrated by `python -m cronbox migrate`. `migrations/env.py` compares only those; the
host's own Alembic env.py passes `include_name` (or `include_object`) so that its
`--autogenerate` leaves them alone instead of proposing to drop them. The prefix, not this
metadata's list, decides: a table an older or newer cronbox has is still cronbox's.
"""
from __future__ import annotations

import cronbox.cron.operator.models  # noqa: F401
import cronbox.cron.scheduling.models  # noqa: F401
import cronbox.outbox.channels.models  # noqa: F401
import cronbox.outbox.core.install  # noqa: F401
from cronbox.outbox.core.models import Base
import cronbox.outbox.engine.models  # noqa: F401
import cronbox.outbox.events.models  # noqa: F401
import cronbox.outbox.queue.models  # noqa: F401
import cronbox.storage.models  # noqa: F401

metadata = Base.metadata
PREFIX = "cronbox_"


def is_cronbox_table(name: str | None) -> bool:
    return name is not None and name.startswith(PREFIX)


def include_name(name, type_, parent_names) -> bool:
    """For the host's `context.configure(include_name=...)`: skip reflecting cronbox's tables.

    Alembic calls it with each reflected `name`, its `type_` ("table", "column", ...) and
    `parent_names`; False (leave it out) for every table whose name starts with `cronbox_`."""
    return not (type_ == "table" and is_cronbox_table(name))


def include_object(object_, name, type_, reflected, compare_to) -> bool:
    """For the host's `context.configure(include_object=...)`: skip cronbox's tables and what is on them
    (columns, indexes, constraints), whether found in the database or in the host's metadata.

    Alembic calls it with the schema item `object_`, its `name` and `type_`, whether it was `reflected`
    from the database, and what it is compared to (`compare_to`); call it from your own filter and
    leave the item out when it returns False."""
    if type_ == "table":
        return not is_cronbox_table(name)
    table = getattr(object_, "table", None)
    return not is_cronbox_table(getattr(table, "name", None))
