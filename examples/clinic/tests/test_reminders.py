"""The evening reminder (clinic.handlers.remind_tomorrow, 18:00 at the clinic): whole ticks run in this
process by cronbox's test kit, its clock moved to the slot and past it. Each evening's slot runs once,
however many ticks come, and the SMS it queues is sent by the same tick's worker."""
from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from conftest import PHONE
from cronbox import send_sms

TEHRAN = ZoneInfo("Asia/Tehran")
REMINDER = "Example Clinic: see you tomorrow at 09:30."


def test_the_evening_before_an_appointment_its_patient_gets_one_reminder(booked, cronbox_kit):
    # The appointment is on 3 Dec at 09:30. At noon on the 2nd the latest slot is the 1st's: no one to remind.
    cronbox_kit.clock.set(datetime(2026, 12, 2, 12, 0, tzinfo=TEHRAN))
    cronbox_kit.tick()
    cronbox_kit.refute_dispatched(send_sms)

    cronbox_kit.clock.set(datetime(2026, 12, 2, 18, 0, 30, tzinfo=TEHRAN))
    tick = cronbox_kit.tick()
    assert tick.jobs_done == 1  # the task's SMS, sent by the same tick's worker
    [sms] = cronbox_kit.assert_dispatched(send_sms, to=PHONE, text=REMINDER)
    assert sms.done and [m.text for m in cronbox_kit.outbox.sms] == [REMINDER]

    cronbox_kit.tick()  # the same slot: not again
    cronbox_kit.clock.advance(hours=23, minutes=59)  # 17:59:30 on the 3rd: still the 2nd's slot
    cronbox_kit.tick()
    cronbox_kit.clock.advance(minutes=1)  # 18:00:30 on the 3rd: a new slot, nobody booked for the 4th
    cronbox_kit.tick()
    assert len(cronbox_kit.dispatched(send_sms)) == 1 and len(cronbox_kit.outbox.sms) == 1
