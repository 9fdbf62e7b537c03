"""This database's install id (table cronbox_install): one row, a random id made by migration 0014.

Sealed payloads bind to it (outbox.core.sealing): an envelope copied into another cronbox database,
sealed under the same keys, does not open there. A dump restored elsewhere brings its row along, so
a restored backup still opens.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from cronbox.outbox.core.models import Base, UtcDateTime


class Install(Base):
    """The one row (id 1): this database's random install id (32 lowercase hex digits)."""

    __tablename__ = "cronbox_install"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    install_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
