from __future__ import annotations

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from clinic import db


class Appointment(db.Model):
    __tablename__ = "clinic_appointments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    patient: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), default="booked")


class Payment(db.Model):
    __tablename__ = "clinic_payments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    appointment_id: Mapped[int] = mapped_column(ForeignKey("clinic_appointments.id"))
    amount: Mapped[str] = mapped_column(String(20))


class Note(db.Model):
    __tablename__ = "clinic_notes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    appointment_id: Mapped[int | None] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(40))
    text: Mapped[str] = mapped_column(String(200))
