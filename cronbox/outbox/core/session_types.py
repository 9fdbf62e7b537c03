"""What cronbox's public calls accept as "the caller's transaction": a Session, a scoped session
(Flask-SQLAlchemy's `db.session`) or, where Core is enough, a Connection; and its connection."""
from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, scoped_session

AnySession = Session | scoped_session[Any]  # the ORM session a row is added to
Transactional = Session | scoped_session[Any] | Connection  # a transaction an INSERT runs in


def connection_of(session: Transactional, model: Any) -> Connection:
    """The connection of the caller's transaction: a Connection as it is, a Session's (or a
    Flask-SQLAlchemy scoped session's) for `model`'s table (a host's binds decide, as they would
    for a flush), begun if it was not. Never a flush: the caller's pending objects stay as they are."""
    if isinstance(session, Connection):
        return session
    return session.connection(bind_arguments={"mapper": model})
