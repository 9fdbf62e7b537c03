"""The operator action log: one row per console action (table cronbox_ops_actions) and one log line.

Rows are added to the caller's session, so an action and its record commit
together; the log line is written by the caller after the commit (`log()`), so
a rolled-back or retried transaction never logs an action that did not happen.
Targets are ids and names (a job id, a grant id, a queue): never a password,
token, phone number or file name.
"""
from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from cronbox.cron.operator.models import OperatorAction
from cronbox.outbox.core import clock, paging

log_ = logging.getLogger("cronbox")
OPERATOR = "operator"  # one operator: the password is the identity


def record(session: Session, action: str, *, target: str | None = None, outcome: str = "ok",
           detail: str | None = None, client_ip: str | None = None, operator: str = OPERATOR) -> OperatorAction:
    row = OperatorAction(at=clock.utcnow(), operator=operator[:64], action=action[:64],
                         target=target and target[:255], outcome=outcome[:32], detail=detail and detail[:500],
                         client_ip=client_ip and client_ip[:45])
    session.add(row)
    return row


def page(session: Session, cursor: tuple | None = None, *, size: int = paging.PAGE_SIZE) -> paging.Page:
    """The log, newest first (cursor: the id)."""
    A = OperatorAction.__table__
    rows = select(A.c.id, A.c.at, A.c.operator, A.c.action, A.c.target, A.c.outcome, A.c.detail, A.c.client_ip)
    return paging.page(session, rows, (A.c.id,), cursor, size=size)


def log(row: OperatorAction) -> None:
    """The action's log line; call it after the transaction that recorded the row committed."""
    log_.info("ops: %s %s%s -> %s (from %s)", row.operator, row.action, f" {row.target}" if row.target else "",
              row.outcome, row.client_ip or "-")
