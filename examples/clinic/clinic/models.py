"""The clinic's own tables. cronbox's tables (all `cronbox_*`) live in the same database but are
migrated by cronbox (`python -m cronbox migrate`), never by `db.create_all()` or the clinic's Alembic."""
from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import ForeignKey, Numeric, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

db = SQLAlchemy()


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Patient(db.Model):
    __tablename__ = "clinic_patients"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(120))
    phone: Mapped[str] = mapped_column(String(32))
    email: Mapped[str] = mapped_column(String(254))


class Appointment(db.Model):
    __tablename__ = "clinic_appointments"

    id: Mapped[int] = mapped_column(primary_key=True)
    patient_id: Mapped[int] = mapped_column(ForeignKey("clinic_patients.id"))
    starts_at: Mapped[datetime]
    fee: Mapped[Decimal] = mapped_column(Numeric(10, 2))
    status: Mapped[str] = mapped_column(String(16), default="booked")  # booked, paid

    patient: Mapped[Patient] = relationship()


class Payment(db.Model):
    """Written synchronously in the request that takes the money: never left to a queue."""

    __tablename__ = "clinic_payments"

    id: Mapped[int] = mapped_column(primary_key=True)
    appointment_id: Mapped[int] = mapped_column(ForeignKey("clinic_appointments.id"), unique=True)
    amount: Mapped[Decimal] = mapped_column(Numeric(10, 2))
    reference: Mapped[str] = mapped_column(String(64))
    paid_at: Mapped[datetime] = mapped_column(default=utcnow)


class Receipt(db.Model):
    """Written by the `appointment.paid` consumer in a cron process (unique: one per payment)."""

    __tablename__ = "clinic_receipts"

    id: Mapped[int] = mapped_column(primary_key=True)
    payment_id: Mapped[int] = mapped_column(ForeignKey("clinic_payments.id"), unique=True)
    number: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
