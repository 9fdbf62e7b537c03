"""The claim: turn due rows into leased rows in one short transaction.

Shared by the outbox relay (deliveries) and the job worker (jobs); each table
family's module supplies its candidate query and the values a claim sets. Three
paths, all at READ COMMITTED on MySQL (set on the engine):

- skip-locked (MySQL >= 8.0.1, MariaDB >= 10.6): lock candidates with
  FOR UPDATE SKIP LOCKED, so concurrent claimers take disjoint rows without
  waiting on each other, then stamp them with our claim token.
- token (older servers, or forced with CRONBOX_CLAIM_MODE=token): read candidate
  ids with a plain (non-locking, consistent) SELECT, then
  `UPDATE ... WHERE id IN (ids) AND <still claimable>`. MySQL refuses a subquery
  on the same table inside UPDATE (errors 1093/1235), hence two statements. Two
  claimers may pick the same ids; the row lock serialises their UPDATEs and the
  "still claimable" guard lets only the first stamp a row. We then read back
  which rows carry our token.
- sqlite: one writer at a time (BEGIN IMMEDIATE holds the write lock from the
  first statement), so the ids read are still ours to stamp.

On PostgreSQL with SKIP LOCKED the job worker's claim does not come here: queue.jobstore claims in
one statement (`_claim_in_one_statement`), with the same rows, order, byte bound and locks.

Nothing here uses "id > last seen" cursors: every pass re-reads what is due, so
a row committed late (an id gap at the time of an earlier pass) is still found.

A batch is bounded by count (the candidates' LIMIT) and by payload bytes (CLAIM_BYTES): what a run
claims it reads, payloads included, and holds until each item's turn. A hundred 5 MB payloads are
500 MB in a run that may have 96; claimed a few at a time they are read when their turn is near,
and what a run gives back unstarted (it stopped, admission deferred it) was never much. The sizes
come from a stored column (`payload_bytes`, written with the payload), read by the candidate query
from rows it visits anyway: nothing more is read for a batch of small items, still one claim.
"""
from __future__ import annotations

from sqlalchemy import Select, Table, select, update
from sqlalchemy.orm import Session

SKIP_LOCKED, TOKEN, SQLITE = "skip-locked", "token", "sqlite"
TOKEN_RACE_RETRIES = 5
# A claim's payloads add up to at most this, or are one payload larger than it (claimed alone).
# A batch of a hundred small items (up to 40 KB each) is never cut; a large payload waits in the
# run for the items claimed before it for at most this much.
CLAIM_BYTES = 4 * 2 ** 20


def claim(session: Session, table: Table, candidates: Select, claimable, values: dict, *, mode: str,
          direct_lock: bool = True, max_bytes: int = CLAIM_BYTES, params: dict | None = None) -> list[int]:
    """Claim rows of `table` chosen by `candidates`: a SELECT of (id, payload bytes), ordered and
    limited, of which a prefix is claimed whose payloads add up to at most `max_bytes` (the first
    row always: a larger payload is claimed alone; an unknown size, NULL, counts as nothing).

    `claimable` re-checks, under the row lock, that a row is still free to claim.
    `values` must set the claim token column (`claim_token`).
    `params`: the values of the bound parameters of `candidates` and `claimable`, for statements
    built once (a family's claim runs twice a batch: building its statements each time costs more
    Python than the batch's items). Their names must not be the table's columns (an UPDATE's).
    `direct_lock`: the candidate query may itself carry FOR UPDATE SKIP LOCKED; pass
    False when it has a correlated subquery on the same table (locking reads do not
    lock subquery rows on MySQL, but we do not rely on what MariaDB versions do). A direct
    lock holds the candidates past the byte bound too, until the claim's COMMIT: they are
    not claimed, and other claimers skip them only for that short while.
    Returns the claimed ids in candidate order.
    """
    token = values["claim_token"]
    id_col = table.c.id
    if mode == SQLITE:
        ids = within_bytes(session.execute(candidates, params), max_bytes)
        if ids:
            session.execute(update(table).where(id_col.in_(ids)).values(values))
        return ids
    if mode == SKIP_LOCKED:
        if direct_lock:
            ids = within_bytes(session.execute(candidates.with_for_update(skip_locked=True), params), max_bytes)
        else:
            found = within_bytes(session.execute(candidates, params), max_bytes)
            if not found:
                return []
            ids = list(session.scalars(
                select(id_col).where(id_col.in_(found), claimable).order_by(id_col).with_for_update(skip_locked=True),
                params))
        if ids:
            session.execute(update(table).where(id_col.in_(ids)).values(values))
        return ids
    if mode == TOKEN:
        # Losing the race for every candidate is not "nothing due": the winner's rows are no
        # longer claimable, so reading again gets the next ones. Without this a worker run
        # with --stop-when-empty would exit while its peer still has a queue to share.
        for _ in range(TOKEN_RACE_RETRIES):
            found = within_bytes(session.execute(candidates, params), max_bytes)
            if not found:
                return []
            session.execute(update(table).where(id_col.in_(found), claimable).values(values), params)
            won = list(session.scalars(
                select(id_col).where(id_col.in_(found), table.c.claim_token == token).order_by(id_col)
            ))
            if won:
                return won
        return []
    raise ValueError(f"unknown claim mode {mode!r}")


def within_bytes(rows, max_bytes: int) -> list[int]:
    """The ids of `rows` ((id, payload bytes) in claim order) up to the first whose payload would take
    the sum past `max_bytes`; the first row's always. An unknown size (NULL) counts as nothing, and a
    row after a first payload larger than the bound is not taken, sized or not: the prefix whose running
    sum stays within the bound, as PostgreSQL's one-statement claim computes it (queue.jobstore)."""
    ids: list[int] = []
    total = 0
    for row_id, size in rows:
        total += size or 0
        if total > max_bytes and ids:
            break
        ids.append(row_id)
    return ids
