"""One module per console page; importing them registers their routes on cronbox.web.ops.bp."""
from . import activity, auth, batches, files, once, outbox, overview, payloads, queues, schedule  # noqa: F401
