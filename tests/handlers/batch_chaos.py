"""Jobs for the batches-and-chains process tests (CRONBOX_HANDLERS=tests.handlers.batch_chaos): members,
callbacks and chain steps that record their effects through ctx.session (exactly once), or only return
a result (the quiet acks' path: the result row, keyed by the job, can be written once). The chaos test
and the runners' tests (tests/processes/test_batch_runners.py) share them.

A member's payload: {"n": its number, "quiet": return n instead of writing, "fail": fail for good,
"add": a list of numbers, each added to its batch as a quiet member (ctx.batch.add)}. A chain step's
payload: its chain's number c, or {"c": c, "fail": True} to fail for good. Callbacks record, as their
effect, whether they ran before their batch had finished, or `then` after a failure or cancel
("early-then"...); catches record the batch's
number (a batch's) or the failed step's index (a chain's, as "chain-catch")."""
from __future__ import annotations

from sqlalchemy import insert

import cronbox
from tests.handlers.effects import effects, pause  # TEST_SLEEP: the "work" handlers' pause


@cronbox.job("chaos", name="chaos.member", timeout=1, tries=100)
def member(payload, ctx):
    pause()
    if payload.get("fail"):
        raise cronbox.PermanentFailure(f"member {payload['n']} fails")
    for n in payload.get("add", ()):
        ctx.batch.add(ctx.session, member, {"n": n, "quiet": True})
    if payload["quiet"]:
        return payload["n"]  # no writes: acked with the others, its result stored with the ack
    ctx.session.execute(insert(effects).values(consumer="member", event_id=payload["n"]))
    return None


def _callback(role, payload, ctx):
    progress = ctx.batch.progress(ctx.session)
    early = progress.pending != 0 or progress.finished_at is None  # its batch finished, and committed that
    if role == "then":  # and `then` only when no member failed (but with allow_failures) and no cancel
        early |= progress.cancelled_at is not None or (progress.failed != 0 and not progress.allow_failures)
    ctx.session.execute(insert(effects).values(consumer=f"early-{role}" if early else role, event_id=payload))


@cronbox.job("chaos", name="chaos.then", timeout=1, tries=100)
def then(payload, ctx):
    _callback("then", payload, ctx)


@cronbox.job("chaos", name="chaos.catch", timeout=1, tries=100)
def catch(payload, ctx):
    ctx.session.execute(insert(effects).values(consumer="catch", event_id=payload))


@cronbox.job("chaos", name="chaos.finally", timeout=1, tries=100)
def finally_(payload, ctx):
    _callback("finally", payload, ctx)


def _step(index, payload, ctx):
    pause()
    c = payload if isinstance(payload, int) else payload["c"]
    if isinstance(payload, dict) and payload.get("fail"):
        raise cronbox.PermanentFailure(f"step {index} of chain {c} fails")
    expected = None if index == 1 else c * 10 + index - 1
    if ctx.previous != expected:
        raise cronbox.PermanentFailure(f"step {index} got {ctx.previous!r} from the step before, not {expected!r}")
    ctx.session.execute(insert(effects).values(consumer=f"step{index}", event_id=c))
    return c * 10 + index


@cronbox.job("chaos", name="chaos.step1", timeout=1, tries=100)
def step1(payload, ctx):
    return _step(1, payload, ctx)


@cronbox.job("chaos", name="chaos.step2", timeout=1, tries=100)
def step2(payload, ctx):
    return _step(2, payload, ctx)


@cronbox.job("chaos", name="chaos.step3", timeout=1, tries=100)
def step3(payload, ctx):
    return _step(3, payload, ctx)


@cronbox.job("chaos", name="chaos.chain_catch", timeout=1, tries=100)
def chain_catch(payload, ctx):
    ctx.session.execute(insert(effects).values(consumer="chain-catch", event_id=payload["step"]))
