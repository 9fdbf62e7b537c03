"""Quiet acks: finished items whose handlers wrote nothing, acked together.

A handler that never touched ctx.session has no writes its ack must commit with (outbox.engine.context),
so the processor (outbox.engine.processor) keeps its ack for a batch: one UPDATE per claim token
(the family's token-guarded `store.ack`, through `Processor._ack`) instead of a transaction per item.
The processor flushes the batch before the earliest of its leases could run out, before a group
opens its transaction on the connection (outbox.engine.group_commit), at once for an item that
holds something others wait for (`Processor._holds_until_ack`), and at the end of its batch.
"""
from __future__ import annotations

import logging
import time
from datetime import datetime

from sqlalchemy.exc import OperationalError

from outbox.core import clock
from outbox.core.db_errors import is_lock_conflict
from outbox.core.faults import crash_point
from outbox.core.lock_wait import lock_wait_error
from outbox.engine.handler_call import ERROR, Outcome

log = logging.getLogger("cronbox")


class QuietAcks:
    """The batch of one processor's quiet acks, written through the processor's own steps (its ack
    write and transaction, its counters and log lines, its failure record)."""

    def __init__(self, processor):
        self.processor = processor  # outbox.engine.processor.Processor (or a subclass)
        self.items: list = []
        self.earliest_lease: datetime | None = None

    def add(self, item) -> None:
        self.items.append(item)
        if self.earliest_lease is None or item.lease_until < self.earliest_lease:
            self.earliest_lease = item.lease_until

    def __bool__(self) -> bool:
        return bool(self.items)

    def flush(self, *, best_effort: bool = False) -> None:
        """Ack the batch in one short transaction. `best_effort` (the run is stopping on an error of
        its own): a failure is logged, and the items run again when their leases expire."""
        if not self.items:
            return
        processor = self.processor
        items, self.items, self.earliest_lease = self.items, [], None
        crash_point("before-ack-commit")
        waiting_since = time.monotonic()
        try:
            acked = processor._transaction(lambda s: processor._ack(s, items, clock.utcnow()), ack=True)
        except Exception as exc:
            if isinstance(exc, OperationalError) and is_lock_conflict(exc) and not best_effort:
                self._blocked(items, time.monotonic() - waiting_since)
                return
            if not best_effort:
                raise
            log.warning("%s: could not ack %d finished items; they will run again", processor.kind, len(items))
            return
        crash_point("after-ack-commit")
        processor._acked(items, acked)

    def _blocked(self, items: list, waited: float) -> None:
        """The acks waited for a lock until the run's time ran out: each item's attempt fails, naming
        the lock wait (recorded if its row can be written by then; if not, LockStillHeld stops the
        run and its lease expires)."""
        processor = self.processor
        error = lock_wait_error("the ack", waited)
        log.warning("%s: %d finished items not acked: %s", processor.kind, len(items), error)
        for item in items:
            processor._after_failure(item, processor._handler(item), Outcome(ERROR, 0.0, error))
