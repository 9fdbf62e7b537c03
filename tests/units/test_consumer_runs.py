"""`@cronbox.consumer(..., runs=...)`: where a consumer runs, and the refusal of an unsaid place next
to a forward target matching its type (outbox.events.placement)."""
from __future__ import annotations

import pytest

from cronbox import outbox
import cronbox
from cronbox.outbox.core.errors import RegistrationError
from cronbox.outbox.engine.registry import Registry
from cronbox.outbox.events import placement


@pytest.mark.parametrize("runs", ["", "Tick", "process", 1, True, ["tick"]])
def test_runs_takes_only_the_three_places(runs):
    with pytest.raises(RegistrationError, match='runs must be "tick", "broker" or "both"'):
        cronbox.consumer("e", name="c", runs=runs, registry=Registry())


@pytest.mark.parametrize("pattern, refused", [("appointment.*", True), ("*", True), ("appointment.paid", True),
                                              ("lab.*", False), ("appointment.pai", False)])
def test_an_unsaid_place_is_refused_only_next_to_a_matching_forward(pattern, refused):
    registry = Registry()
    cronbox.forward(pattern, exchange="x", name="fwd", registry=registry)
    cronbox.consumer("appointment.paid", name="notify", registry=registry)(lambda e, c: None)
    if refused:
        with pytest.raises(RegistrationError, match="consumer 'notify' of 'appointment.paid' is also forwarded") as refusal:
            placement.check(registry.consumers)
        # the fix in 0.7's spelling (issue 35: it named `@cronbox.consumer`, which 0.7 does not install)
        assert '@cronbox.consumer(..., runs="tick")' in str(refusal.value)
    else:
        placement.check(registry.consumers)


@pytest.mark.parametrize("runs, tick, broker", [("tick", True, False), ("broker", False, True), ("both", True, True)])
def test_each_place_is_run_by_its_side_only(runs, tick, broker):
    registry = Registry()
    cronbox.forward("*", exchange="x", name="fwd", registry=registry)
    cronbox.consumer("e", name="c", runs=runs, registry=registry)(lambda e, c: None)
    placement.check(registry.consumers)
    consumer, target = registry.consumers.get("c"), registry.consumers.get("fwd")
    assert (placement.runs_in_tick(consumer), placement.runs_off_broker(consumer)) == (tick, broker)
    assert placement.runs_in_tick(target) and not placement.runs_off_broker(target)
