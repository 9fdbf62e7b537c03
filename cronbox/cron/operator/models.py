"""Tables of the operator console: sessions and the log of what the operator did."""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Index, String
from sqlalchemy.orm import Mapped, mapped_column

from cronbox.outbox.core.models import Base, ExactString, Id, UtcDateTime


OPS_SESSION_IDLE = timedelta(hours=2)  # a console session ends after this long without a request...
OPS_SESSION_ABSOLUTE = timedelta(hours=12)  # ...and this long after login, however busy


class OperatorSession(Base):
    """A logged-in browser. The cookie carries a random id; only its SHA-256 is stored, so a
    database dump opens no session. Logout or a password change deletes rows: a copied cookie
    stops working at once, which a signed cookie alone could not promise."""

    __tablename__ = "cronbox_ops_sessions"

    id_hash: Mapped[str] = mapped_column(ExactString(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    seen_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)  # absolute end, whatever the activity
    password_fingerprint: Mapped[str] = mapped_column(String(16))  # of the password hash in force at login
    client_ip: Mapped[str | None] = mapped_column(String(45))
    user_agent: Mapped[str | None] = mapped_column(String(255))

    __table_args__ = (Index(None, "expires_at"),)


class OperatorAction(Base):
    """Append-only: every console action (and login, logout, failed login) with operator and time."""

    __tablename__ = "cronbox_ops_actions"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime)
    operator: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str | None] = mapped_column(String(255))
    outcome: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(String(500))
    client_ip: Mapped[str | None] = mapped_column(String(45))

    __table_args__ = (Index(None, "at"),)
