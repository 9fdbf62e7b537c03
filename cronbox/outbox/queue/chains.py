"""A chain's progress, read from its steps' job rows (issue 39): which step it is on, each step's state.

A chain has no row of its own, and no state but its jobs' (outbox.queue.batches dispatches it): its
first step is a job whose `flow` holds the steps still to come; the transaction that makes a step done
dispatches the next one, and records in the finished step's flow that job's id ("next"), as a failed
step's flow records the chain's catch ("catch_job"); every later step's flow names the first step's
job ("first"). So, from any step's job id, the chain is read by primary key: its first step, then each
"next", one row per step, never a scan; the steps not dispatched yet are the last row's "rest" (their
handlers, never their payloads).

Each step's `status` is its job's (ready, reserved, done, failed) or, for a step without a job:
"later" (the chain has not reached it), "stopped" (a step before it failed: it never runs), "pruned"
(its job was deleted by `queue prune` / `queue flush` after it finished).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from cronbox.outbox.core.session_types import Transactional
from cronbox.outbox.core.inserts import connection_of
from cronbox.outbox.core.sealing import FLOWS, open_payload
from cronbox.outbox.queue.models import DONE, FAILED, READY, RESERVED, Job

J = Job.__table__
LATER, STOPPED, PRUNED = "later", "stopped", "pruned"
_COLUMNS = (J.c.id, J.c.handler, J.c.status, J.c.attempts, J.c.last_error, J.c.finished_at, J.c.flow,
            J.c.seal_id)


@dataclass(frozen=True)
class ChainStep:
    """One step of a chain: its index (0 first), its job's handler and id (None: no job yet, or pruned),
    its status (a job's: ready, reserved, done, failed; or later, stopped, pruned), its job's attempts,
    last error and finish time."""
    index: int
    handler: str | None
    job_id: int | None
    status: str
    attempts: int = 0
    error: str | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class ChainProgress:
    """A chain's progress (`cronbox.chain_progress`, `chain.progress(session)`, `queue chain JOB_ID`):
    its id, its steps in order, and its catch's job (a ChainStep at the failed step's index; None
    unless a step failed and the chain has a catch)."""
    id: str
    steps: tuple[ChainStep, ...]
    catch: ChainStep | None = None

    @property
    def state(self) -> str:
        """failed (a step failed after its tries: the rest never run), finished (every step done), or running."""
        statuses = {step.status for step in self.steps}
        if FAILED in statuses:
            return "failed"
        return "running" if statuses & {READY, RESERVED, LATER} else "finished"

    @property
    def current(self) -> ChainStep | None:
        """The step it is on (its job waiting or running); None once it finished or failed."""
        return next((step for step in self.steps if step.status in (READY, RESERVED)), None)


def _step(row, index: int) -> ChainStep:
    return ChainStep(index, row.handler, row.id, row.status, row.attempts, row.last_error, row.finished_at)


def chain_progress(session: Transactional, job_id: int) -> ChainProgress | None:
    """The progress of the chain whose step is job `job_id` (any step's job id), read on `session`;
    None when that job is not a chain's step (or is gone). One primary-key read per step."""
    connection = connection_of(session, Job)

    def row_of(wanted: int):
        return connection.execute(select(*_COLUMNS).where(J.c.id == wanted)).first()

    def flow_of(row) -> dict:
        # A sealed chain's flow (it carries the previous step's result) opened in memory, under the
        # current sealer's keys, for its links only: nothing of it is shown.
        return open_payload(None, FLOWS, row.handler, row.seal_id, row.flow, connection)

    row = row_of(job_id)
    flow = flow_of(row) if row is not None and row.flow is not None else {}
    if "chain" not in flow or "step" not in flow:
        return None
    first = row_of(flow["first"]) if flow.get("first") is not None else None
    if first is not None:
        row, flow = first, flow_of(first)
    steps = [ChainStep(index, None, None, PRUNED) for index in range(flow["step"])]  # before the first row kept
    catch = None
    while True:
        steps.append(_step(row, flow["step"]))
        rest = [spec[0] for spec in flow.get("rest", [])]
        following = row_of(flow["next"]) if row.status == DONE and flow.get("next") is not None else None
        if following is None:
            break
        row, flow = following, flow_of(following)
    after = flow["step"] + 1
    if row.status == FAILED:
        left = STOPPED
        if flow.get("catch_job") is not None:
            caught = row_of(flow["catch_job"])
            catch = _step(caught, flow["step"]) if caught is not None else ChainStep(flow["step"], None, None, PRUNED)
    else:
        # Waiting or running: the rest comes later. Done with a rest and no next job known: the next one
        # was pruned (the link is written with the done), and so are those after it, as far as we know.
        left = LATER if row.status in (READY, RESERVED) else PRUNED
    steps += [ChainStep(after + offset, handler, None, left) for offset, handler in enumerate(rest)]
    return ChainProgress(flow["chain"], tuple(steps), catch)
