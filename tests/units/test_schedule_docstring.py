"""The scheduling module's docstring example runs as written (issue 24: its `from cron import schedule`
failed), registering what it says."""
from __future__ import annotations

import re
import textwrap
from functools import partial

from cronbox.cron.scheduling import schedule
from cronbox.outbox.engine.registry import Registry


def test_the_schedule_docstring_example_runs_and_registers_its_tasks(monkeypatch):
    registry = Registry()
    monkeypatch.setattr(schedule, "every", partial(schedule.every, registry=registry))
    monkeypatch.setattr(schedule, "cron", partial(schedule.cron, registry=registry))
    example = textwrap.dedent(re.match(r'\n*(.*?)\n\n[A-Z]', schedule.__doc__.split("\n", 1)[1], re.S).group(1))
    exec(compile(example, "cron/scheduling/schedule.py", "exec"), {"__name__": "tasks"})
    assert {task.name: task.describe() for task in registry.tasks.all()} == {
        "tasks.refresh_rates": "every 5m", "settle_escrow": "cron 0 3 * * * (Asia/Tehran)"}

