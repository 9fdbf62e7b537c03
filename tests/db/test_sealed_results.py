"""What a sealed job carries beyond its payload, sealed on every backend (issue 40, with issue 39's work
made of several jobs): its result, a sealed chain's flow (the later steps' payloads, ctx.previous) and
rows, a batch's sealed callbacks, and its members' results as `then` reads them. After each run no
column of cronbox's job tables holds the marker; the handlers get everything opened; a rotation
re-seals results and flows, and the old key can go."""
from __future__ import annotations

import pytest
from sqlalchemy import select, update

import cronbox
from cronbox.outbox.core import sealing
from cronbox.outbox.core.sealing import PayloadIntegrityError
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import DONE, FAILED, Job, JobBatch, JobResult
from cronbox.outbox.queue.worker import Worker
from cronbox.storage import keys
from cronbox.storage.payload_keys import sealer_of

MARKER = "PHI-MARKER Jane Roe"


def drain(rt, queues=None, rounds=20):
    for _ in range(rounds):
        worker = Worker(rt, queues)
        worker.run(Budget(max_time=60, memory_mb=None))
        if not worker.stats.done + worker.stats.gave_up:
            return


def stored_text(rt) -> str:
    """Every text column a sealed job may leave something in: payloads, flows, results, batch callbacks."""
    with rt.sessions() as session:
        parts = [f"{r.payload}|{r.flow}|{r.last_error}" for r in session.execute(select(Job.payload, Job.flow,
                                                                                          Job.last_error))]
        parts += list(session.scalars(select(JobResult.value)))
        parts += [f"{r.payload}|{r.callbacks}" for r in session.execute(select(JobBatch.payload, JobBatch.callbacks))]
    return "\n".join(parts)


def rows(rt) -> list[Job]:
    with rt.sessions() as session:
        return list(session.scalars(select(Job).order_by(Job.id)))


def sealed(value: str | None) -> bool:
    return value is not None and value.startswith("cbxp1:")


def test_a_sealed_jobs_result_is_sealed_read_back_opened_and_bound_to_its_job(runtime, registry):
    @job("q", name="results.lookup", sealed=True, registry=registry)
    def lookup(payload, ctx):
        return {"patient": MARKER}

    @job("q", name="results.plain", registry=registry)
    def plain(payload, ctx):
        return {"n": payload}

    with runtime.sessions.begin() as session:
        secret, other = lookup.dispatch(session, {"id": 7}), plain.dispatch(session, 1)
    drain(runtime, ["q"])
    with runtime.sessions() as session:
        values = dict(session.execute(select(JobResult.job_id, JobResult.value)).all())
        assert sealed(values[secret]) and values[other] == '{"n":1}'
        assert lookup.result(session, secret).value == {"patient": MARKER}
    assert MARKER not in stored_text(runtime)
    with runtime.engine.begin() as connection:  # the envelope copied to another job's result: it does not open
        connection.execute(update(JobResult).where(JobResult.job_id == other).values(value=values[secret]))
    with runtime.sessions() as session, pytest.raises(PayloadIntegrityError):
        plain.result(session, other)


def test_a_chain_with_a_sealed_step_is_sealed_whole_and_passes_each_result_on_opened(runtime, registry):
    seen = []

    def step(name, sealed_=False):
        @job("q", name=f"chain.{name}", sealed=sealed_, registry=registry)
        def run(payload, ctx):
            seen.append((name, payload, ctx.previous))
            return {"found": f"{MARKER} {name}"}
        return run

    first, second, third = step("first"), step("second", sealed_=True), step("third")
    with runtime.sessions.begin() as session:
        cronbox.chain(session, [(first, {"p": f"{MARKER} a"}), (second, {"p": f"{MARKER} b"}),
                                (third, {"p": f"{MARKER} c"})])
    [waiting] = rows(runtime)
    assert sealed(waiting.payload) and sealed(waiting.flow) and waiting.seal_id  # a plain step of a sealed chain too
    assert MARKER not in stored_text(runtime)  # the later steps' payloads ride in the flow, sealed
    drain(runtime, ["q"])
    assert seen == [("first", {"p": f"{MARKER} a"}, None),
                    ("second", {"p": f"{MARKER} b"}, {"found": f"{MARKER} first"}),
                    ("third", {"p": f"{MARKER} c"}, {"found": f"{MARKER} second"})]
    done = rows(runtime)
    assert [r.status for r in done] == [DONE] * 3
    assert all(sealed(r.payload) and sealed(r.flow) for r in done)  # the links ("next") written sealed too
    assert MARKER not in stored_text(runtime)  # ctx.previous rode in the next step's sealed flow, results sealed
    with runtime.sessions() as session:  # its progress follows the links inside the sealed flows
        progress = cronbox.chain_progress(session, done[-1].id)
    assert [(s.handler, s.job_id, s.status) for s in progress.steps] == [(r.handler, r.id, DONE) for r in done]
    assert progress.state == "finished"


def test_a_sealed_chains_catch_is_a_sealed_row_and_gets_what_failed(runtime, registry):
    got = []

    @job("q", name="chain.fails", sealed=True, tries=1, registry=registry)
    def fails(payload, ctx):
        raise RuntimeError("no such patient")

    @job("q", name="chain.never", registry=registry)
    def never(payload, ctx):
        raise AssertionError("the chain stops at a failed step")

    @job("q", name="chain.catch", registry=registry)
    def catch(payload, ctx):
        got.append(payload)

    with runtime.sessions.begin() as session:
        made = cronbox.chain(session, [(fails, {"p": MARKER}), (never, {"p": MARKER})], catch=catch)
    drain(runtime, ["q"])
    caught = [r for r in rows(runtime) if r.handler == "chain.catch"]
    assert len(caught) == 1 and sealed(caught[0].payload) and caught[0].seal_id
    assert got == [{"chain": made.id, "step": 0, "job": "chain.fails", "job_id": made.first_job_id,
                    "error": "RuntimeError: no such patient"}]
    assert MARKER not in stored_text(runtime)
    failed = next(r for r in rows(runtime) if r.handler == "chain.fails")
    assert sealed(failed.flow)  # its link to the catch ("catch_job") written sealed
    with runtime.sessions() as session:
        progress = cronbox.chain_progress(session, made.first_job_id)
    assert [s.status for s in progress.steps] == [FAILED, "stopped"] and progress.state == "failed"
    assert progress.catch is not None and (progress.catch.job_id, progress.catch.status) == (caught[0].id, DONE)


def test_sealed_members_results_reach_then_opened_and_sealed_callbacks_are_sealed_rows(runtime, registry):
    got = []

    @job("m", name="batch.member", sealed=True, registry=registry)
    def member(payload, ctx):
        return {"v": f"{MARKER} {payload}"}

    @job("m", name="batch.then", sealed=True, registry=registry)
    def then(payload, ctx):
        got.append((payload, [value for _job_id, value in ctx.batch.results(ctx.session)]))

    with runtime.sessions.begin() as session:
        made = cronbox.batch(session, name="scans", then=then, payload={"ward": 3})
        for n in range(3):
            member.dispatch(session, n, batch=made)
    drain(runtime, ["m"])
    assert got == [({"ward": 3}, [{"v": f"{MARKER} {n}"} for n in range(3)])]
    callback = [r for r in rows(runtime) if r.handler == "batch.then"]
    assert len(callback) == 1 and sealed(callback[0].payload) and callback[0].status == DONE
    assert MARKER not in stored_text(runtime)


@pytest.mark.backends("sqlite", "mysql-token", "postgresql")
def test_rewrap_reseals_results_and_chain_flows_so_the_old_key_can_go(runtime, registry, settings):
    from cronbox.cron.scheduling.health import run_checks
    from cronbox.storage import payload_maintenance

    seen = []

    @job("q", name="rotate.result", sealed=True, registry=registry)
    def result(payload, ctx):
        return {"patient": MARKER}

    @job("later", name="rotate.step", sealed=True, registry=registry)
    def step(payload, ctx):
        seen.append((payload, ctx.previous))
        return payload

    with runtime.sessions.begin() as session:
        done = result.dispatch(session, 1)
        cronbox.chain(session, [(step, 1), (step, 2)])
    drain(runtime, ["q"])  # the result is stored; the chain waits on its queue
    old = rows(runtime)[0].payload.split(":")[1]
    new = keys.new_key(settings, keys.ENCRYPTION)
    fresh = sealer_of(settings)
    runtime.sealer_source = lambda: fresh
    with sealing.using(fresh):
        rewrapped = payload_maintenance.rewrap(runtime.sessions, fresh)
        assert (rewrapped.done, rewrapped.failed) == (2, [])  # the chain's waiting row (payload, flow), the result
        (settings.key_folder / f"{old}.key").unlink()
        [check] = [c for c in run_checks(runtime).checks if c.name == "payload_keys"]
        assert check.status == "ok", check.detail  # nothing waits under the deleted key
        with runtime.sessions() as session:
            assert result.result(session, done).value == {"patient": MARKER}
            assert session.scalar(select(JobResult.value).where(JobResult.job_id == done)).split(":")[1] == new
        drain(runtime, ["later"])
    assert seen == [(1, None), (2, 1)]
