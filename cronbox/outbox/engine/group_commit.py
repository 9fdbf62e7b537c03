"""Group commit: consecutive claimed items of grouped handlers share ONE transaction.

A handler registered with `grouped=True` (no network calls: forward targets and the built-in
channels never are) may share its transaction with the grouped items claimed after it. The
runner (outbox.engine.runner, `Runner._run_group`) meets the first such item in its loop
and runs members while they may join (`may_join`, CRONBOX_GROUP_MAX, CRONBOX_GROUP_MS, capped by
CRONBOX_ACK_FLUSH: what a killed run calls again); this module
is the group itself: its transaction on the run's connection, what each member's outcome does to
it (`CommitGroup.ended`), and the one UPDATE that acks the members that succeeded just before the
one COMMIT (`CommitGroup.commit`). A group of N costs two statements instead of 2N, and each ack
still commits with its handler's writes (exactly once).

What a member's ctx.session does inside the group's transaction is outbox.engine.context's (a
SAVEPOINT per member); what it costs when the group cannot commit is `CommitGroup`'s docstring.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Callable

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from cronbox.outbox.core import clock
from cronbox.outbox.core.db_errors import is_deadlock
from cronbox.outbox.core.faults import crash_point
from cronbox.outbox.core.logs import log_text
from cronbox.outbox.core.sealing import is_sealed
from cronbox.outbox.core.text import describe
from cronbox.outbox.engine.context import Context
from cronbox.outbox.engine.handler_call import TIMEOUT, Outcome
from cronbox.outbox.engine.outcomes import exhausted
from cronbox.outbox.engine.settle import settle

log = logging.getLogger("cronbox")

DONE, FAILED, CULPRIT, LOST = "done", "failed", "culprit", "lost"  # a member's end in its group (settle)


class CommitGroup:
    """One group's transaction on the run's connection, begun by the first write. Each handler's
    ctx.session works in a SAVEPOINT of it (kept on success, rolled back on failure, where the
    item's reschedule or give-up is then written); the acks of those that succeeded go in one
    UPDATE just before the one COMMIT, so each ack still commits with its writes.

    `lost` says why the whole transaction cannot commit: a handler timed out (the connection is
    discarded), a deadlock (MySQL 1213 rolls back every savepoint), the connection dropped, a
    handler that had released its savepoint (commit()) failed, an ack found its lease expired, or
    the COMMIT failed. Then nothing of it counts: the members run again one per transaction under
    the same claim, whose one counted attempt is theirs (a neighbour's fault costs them nothing);
    the one whose own timeout lost it has that failure recorded instead. A member the run cannot
    run again is released (attempt refunded: `release`, token-guarded, in the family's store).
    """

    def __init__(self, connection: Connection, token: str):
        self.connection = connection
        self.token = token
        self.outer = None  # the group's transaction, once a member (or a failure's record) writes
        self._session: Session | None = None
        self.acks: list = []  # items whose handlers succeeded, acked together before the COMMIT
        self.after_commit: list[Callable[[], None]] = []  # counters and log lines the COMMIT makes true
        self.lost: str | None = None

    def begin(self) -> None:
        if self.outer is None:
            self.outer = self.connection.begin()

    @property
    def session(self) -> Session:
        """The outcomes' writes in the group's transaction (acks, reschedules, give-ups)."""
        if self._session is None:
            self.begin()
            self._session = Session(bind=self.connection, join_transaction_mode="rollback_only",
                                    expire_on_commit=False)
        return self._session

    def lose_on_error(self, context) -> None:
        """A statement on the group's connection failed (SQLAlchemy's handle_error context): a
        deadlock (MySQL's 1213 rolled back the whole transaction, every savepoint in it; PostgreSQL's
        40P01 is taken the same way) or a lost
        connection loses the group, even if the handler caught the error and went on."""
        if self.lost or context.connection is not self.connection:
            return
        if is_deadlock(context.original_exception):
            self.lost = "deadlock: the server rolled the transaction back"
        elif context.is_disconnect:
            self.lost = "the database connection was lost"

    def ended(self, item, ctx: Context, outcome: Outcome) -> tuple[str, Outcome]:
        """One member's outcome inside the group, and the outcome to record if it failed: DONE (acked
        with the group), FAILED (its savepoint rolled back: the caller writes its retry or give-up in
        the group), CULPRIT (its own timeout lost the group), or LOST (the group is lost). A member
        that succeeded has its writes settled (outbox.engine.settle): kept in its savepoint."""
        transaction = ctx.transaction
        if outcome.kind == TIMEOUT and transaction is not None:
            ctx.discard_session(invalidate=True)  # perhaps mid-query: the connection is gone, and the group
            self.lost = self.lost or "a handler timed out: its connection was discarded"
            return CULPRIT, outcome
        # A timeout of a handler that never touched the connection is an ordinary failure, below.
        if outcome.ok and transaction is None:
            self.acks.append(item)
            return DONE, outcome
        if outcome.ok:
            outcome = settle(ctx, outcome)
            if outcome.ok:
                if self.lost:
                    return LOST, outcome
                self.acks.append(item)
                return DONE, outcome
        if transaction is not None:
            if transaction.session.released:
                self.lost = self.lost or "a handler that called ctx.session.commit() failed"
            try:
                ctx.discard_session()  # ROLLBACK TO its savepoint: the others' writes stay
            except Exception as exc:
                self.lost = self.lost or f"could not roll back to the handler's savepoint: {describe(exc, 200)}"
        return (LOST if self.lost else FAILED), outcome

    def commit(self, ack: Callable[[Session], int]) -> int:
        """The members' acks in one statement (`ack(session)`: the family's token-guarded writes,
        outbox.engine.outcomes.Outcomes.ack), then the one COMMIT; how many were acked (0 when it lost
        the group). An ack that finds its lease expired loses the group: which member it was cannot be
        told, and its writes must not commit. Only for a group that wrote."""
        try:
            acked = ack(self.session) if self.acks else 0
            if acked != len(self.acks):
                self.lost = f"{len(self.acks) - acked} of {len(self.acks)} acks found their lease expired"
                return 0
            crash_point("before-ack-commit")
            self.outer.commit()
            crash_point("after-ack-commit")
        except Exception as exc:
            self.lost = self.lost or f"the group's commit failed: {describe(exc, 200)}"
            return 0
        return acked

    def close(self) -> None:
        """Roll back whatever did not commit (nothing, after a COMMIT). Never raises: a connection
        gone by now is replaced by the pool on its next use."""
        try:
            try:
                if self._session is not None:
                    self._session.close()
            finally:
                if self.outer is not None and self.outer.is_active:
                    self.outer.rollback()
        except Exception as exc:
            log.warning("group: rollback failed (%s)", log_text(describe(exc, 200)))


def may_join(item, handler, token: str, settings) -> bool:
    """The rule for an item to run in a group: its handler opted in (`grouped=True`), groups are on
    (CRONBOX_GROUP_MAX > 1), it comes from the group's claim, it still has an attempt, and its lease
    covers its timeout plus the group's time (CRONBOX_GROUP_MS). A sealed payload runs alone: its
    opening may fail (an altered envelope, a missing key), and only a lone item's failure before its
    handler's call is recorded as its own (outbox.core.sealing)."""
    return (handler is not None and not is_sealed(item.payload) and getattr(handler, "grouped", False)
            and settings.group_max > 1
            and item.claim_token == token and not exhausted(item, handler)
            and clock.utcnow() + timedelta(seconds=handler.timeout, milliseconds=settings.group_ms)
            <= item.lease_until)
