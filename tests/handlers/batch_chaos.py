"""Jobs for the batches-and-chains chaos test (CRONBOX_HANDLERS=tests.handlers.batch_chaos): members,
callbacks and chain steps that record their effects through ctx.session (exactly once), or only return
a result (the quiet acks' path: the result row, keyed by the job, can be written once)."""
from __future__ import annotations

from sqlalchemy import insert

import cronbox
from tests.handlers.effects import effects, pause  # TEST_SLEEP: the "work" handlers' pause


@cronbox.job("chaos", name="chaos.member", timeout=1, tries=100)
def member(payload, ctx):
    pause()
    if payload["quiet"]:
        return payload["n"]  # no writes: acked with the others, its result stored with the ack
    ctx.session.execute(insert(effects).values(consumer="member", event_id=payload["n"]))
    return None


def _callback(role, payload, ctx):
    progress = ctx.batch.progress(ctx.session)
    early = progress.pending != 0 or progress.done != progress.total
    ctx.session.execute(insert(effects).values(consumer=f"early-{role}" if early else role, event_id=payload))


@cronbox.job("chaos", name="chaos.then", timeout=1, tries=100)
def then(payload, ctx):
    _callback("then", payload, ctx)


@cronbox.job("chaos", name="chaos.finally", timeout=1, tries=100)
def finally_(payload, ctx):
    _callback("finally", payload, ctx)


def _step(index, payload, ctx):
    pause()
    expected = None if index == 1 else payload * 10 + index - 1
    if ctx.previous != expected:
        raise cronbox.PermanentFailure(f"step {index} got {ctx.previous!r} from the step before, not {expected!r}")
    ctx.session.execute(insert(effects).values(consumer=f"step{index}", event_id=payload))
    return payload * 10 + index


@cronbox.job("chaos", name="chaos.step1", timeout=1, tries=100)
def step1(payload, ctx):
    return _step(1, payload, ctx)


@cronbox.job("chaos", name="chaos.step2", timeout=1, tries=100)
def step2(payload, ctx):
    return _step(2, payload, ctx)


@cronbox.job("chaos", name="chaos.step3", timeout=1, tries=100)
def step3(payload, ctx):
    return _step(3, payload, ctx)
