"""What cronbox's public calls accept as "the caller's transaction": a Session, a scoped session
(Flask-SQLAlchemy's `db.session`) or, where Core is enough, a Connection. Type aliases only."""
from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, scoped_session

AnySession = Session | scoped_session[Any]  # the ORM session a row is added to
Transactional = Session | scoped_session[Any] | Connection  # a transaction an INSERT runs in
