"""Cost budget settings and group names, without a database (outbox.queue.groups)."""
from __future__ import annotations

from datetime import datetime

import pytest

from cronbox.outbox.core.errors import SettingsError
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.queue import groups


def settings(**raw):
    return load_settings(environ={"DATABASE_URL": "sqlite://", "CRONBOX_HANDLERS": "", **raw})


def test_budgets_are_read_from_both_settings():
    found = groups.budgets(settings(CRONBOX_QUEUE_BUDGETS=" sms = 100/m , mail=2000/h,",
                                    CRONBOX_GROUP_BUDGETS="providers=5/10s"))
    assert found == {("queue", "sms"): groups.CostBudget("queue", "sms", 100, 60),
                     ("queue", "mail"): groups.CostBudget("queue", "mail", 2000, 3600),
                     ("group", "providers"): groups.CostBudget("group", "providers", 5, 10)}
    assert [b.spec for b in found.values()] == ["100/m", "2000/h", "5/10s"]
    assert groups.budgets(settings()) == {}


@pytest.mark.parametrize("raw, message", [
    ("sms", "'sms' must look like NAME=100/m"),
    ("sms=", "sms='' must look like 100/m"),
    ("sms=0/m", "sms='0/m' must look like 100/m"),
    ("sms=10/d", "sms='10/d' must look like 100/m"),
    ("a b=1/m", "'a b=1/m' must look like NAME=100/m"),
    ("sms=1/m,sms=2/m", "sms is given twice"),
])
def test_a_bad_budget_setting_names_itself(raw, message):
    with pytest.raises(SettingsError, match="^CRONBOX_QUEUE_BUDGETS: ") as caught:
        groups.budgets(settings(CRONBOX_QUEUE_BUDGETS=raw))
    assert message in str(caught.value)


def test_windows_and_buckets():
    budget = groups.CostBudget("group", "g" * 64, 10, 60)
    assert len(budget.bucket) <= 64 and budget.bucket.startswith("budget:group:sha256:")
    assert groups.CostBudget("queue", "sms", 1, 60).bucket == "budget:queue:sms"
    assert budget.window_of(datetime(2026, 11, 30, 12, 0, 59)) == budget.window_of(datetime(2026, 11, 30, 12, 0, 0))
    assert budget.window_of(datetime(2026, 11, 30, 12, 1, 0)) - budget.window_of(datetime(2026, 11, 30, 12, 0, 0)) == 60


def test_the_group_wait_setting():
    assert groups.full_wait(settings()) == 2.0
    assert groups.full_wait(settings(CRONBOX_GROUP_WAIT="0.5")) == 0.5
    with pytest.raises(SettingsError, match="CRONBOX_GROUP_WAIT"):
        groups.full_wait(settings(CRONBOX_GROUP_WAIT="soon"))
