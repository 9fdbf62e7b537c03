"""What a consumer or job receives.

`ctx.session` is opened on first use and commits together with the ack, so a
handler's database writes happen exactly once. A handler that never touches it
has no database effects to protect, which lets the processor batch its ack
(outbox/engine/processor.py, QuietAcks).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker


@dataclass(frozen=True)
class Event:
    id: int
    type: str
    key: str | None
    payload: Any
    created_at: datetime


class Context:
    def __init__(self, *, attempt: int, trace_id: str, idempotency_key: str, sessions: sessionmaker[Session],
                 settings=None):
        self.attempt = attempt
        self.settings = settings  # the run's Settings (channels read their configuration here)
        self.trace_id = trace_id
        self.idempotency_key = idempotency_key
        self._sessions = sessions
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = self._sessions()
        return self._session

    @property
    def session_used(self) -> bool:
        return self._session is not None

    def discard_session(self, *, invalidate: bool = False) -> None:
        """Roll back the handler's writes; `invalidate` drops the connection (after a timeout
        interrupted it mid-query, it must not go back to the pool)."""
        if self._session is None:
            return
        try:
            if invalidate:
                self._session.invalidate()
            else:
                self._session.rollback()
        finally:
            self._session.close()
            self._session = None

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def __repr__(self) -> str:
        return f"Context(attempt={self.attempt}, trace_id={self.trace_id!r}, idempotency_key={self.idempotency_key!r})"
