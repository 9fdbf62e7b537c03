"""An example domain: a clinic appointment paid through escrow.

It shows the rule cronbox is built around. The money moves (payment, escrow
hold) are written synchronously in the domain transaction, never queued; the
side effects (patient notification, clinic receipt) are outbox events written
in the same transaction and delivered by the tick.

The demo's tables are its own (`demo_*`, created here with create_all), not part
of cronbox's migrated schema. Register its consumers with
CRONBOX_HANDLERS=cronbox.cron.demo.
"""
from __future__ import annotations

import secrets
from datetime import datetime
from decimal import Decimal

from sqlalchemy import DateTime, ForeignKey, Integer, MetaData, Numeric, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from cronbox import Context, Event, consumer, record
from cronbox.outbox.core import clock


class DemoBase(DeclarativeBase):
    metadata = MetaData()


class Appointment(DemoBase):
    __tablename__ = "demo_appointments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    patient_ref: Mapped[str] = mapped_column(String(32))
    clinic: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime)


class Payment(DemoBase):
    __tablename__ = "demo_payments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    appointment_id: Mapped[int] = mapped_column(ForeignKey("demo_appointments.id"))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    status: Mapped[str] = mapped_column(String(16))


class Escrow(DemoBase):
    __tablename__ = "demo_escrows"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    payment_id: Mapped[int] = mapped_column(ForeignKey("demo_payments.id"))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    status: Mapped[str] = mapped_column(String(16))  # held -> released


class Notification(DemoBase):
    __tablename__ = "demo_notifications"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    appointment_id: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    delivery_key: Mapped[str] = mapped_column(String(64), unique=True)


def create_tables(engine) -> None:
    DemoBase.metadata.create_all(engine)


def pay_appointment(session: Session, *, clinic: str, amount: Decimal) -> Appointment:
    """The domain transaction: appointment, payment and escrow rows plus one outbox event.
    The caller commits; all of it lands together or not at all."""
    appointment = Appointment(patient_ref=secrets.token_hex(4), clinic=clinic, status="paid",
                              created_at=clock.utcnow())
    session.add(appointment)
    session.flush()
    payment = Payment(appointment_id=appointment.id, amount=amount, status="captured")
    session.add(payment)
    session.flush()
    session.add(Escrow(payment_id=payment.id, amount=amount, status="held"))
    record(session, "appointment.paid",
           {"appointment_id": appointment.id, "clinic": clinic, "amount": str(amount)},
           key=f"appointment:{appointment.id}")
    return appointment


@consumer("appointment.paid", name="demo.notify_patient")
def notify_patient(event: Event, ctx: Context) -> None:
    """Writes an in-app notification through ctx.session: committed with the ack, so exactly once."""
    ctx.session.add(Notification(appointment_id=event.payload["appointment_id"], kind="payment-received",
                                 delivery_key=ctx.idempotency_key))


@consumer("appointment.paid", name="demo.clinic_receipt")
def clinic_receipt(event: Event, ctx: Context) -> None:
    ctx.session.add(Notification(appointment_id=event.payload["appointment_id"], kind="clinic-receipt",
                                 delivery_key=ctx.idempotency_key))


def counts(session: Session) -> dict[str, int]:
    return {
        "appointments": len(session.scalars(select(Appointment.id)).all()),
        "notifications": len(session.scalars(select(Notification.id)).all()),
    }
