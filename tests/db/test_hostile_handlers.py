"""Whatever a consumer or job raises, returns or does to ctx.session, only its own item is affected:
the outcome is recorded with a safe error text, the rest of the tick runs, the process exits 0."""
from __future__ import annotations

import gc
import logging
import re
import signal
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import PendingRollbackError
from sqlalchemy import insert, select

from cronbox.cron.cli import main
from cronbox.cron.scheduling.tick import run_tick
from cronbox import outbox
import cronbox
from cronbox.outbox.core import clock
from cronbox.outbox.core.logs import LOGGER, DailyFileHandler, UtcFormatter
from cronbox.outbox.core.payload import load_payload
from cronbox.outbox.engine.budget import Budget
from cronbox.outbox.events.consumers import consumer
from cronbox.outbox.events.models import Delivery, OutboxEvent
from cronbox.outbox.events.relay import Relay
from cronbox.outbox.queue.jobs import job
from cronbox.outbox.queue.models import Job
from cronbox.outbox.queue.worker import Worker
from tests.conftest import ONE_MYSQL_MODE, run_cli
from tests.handlers import hostile

# What a handler does to its process and session: MariaDB's claim mode changes nothing here.
pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ \[\d+\] ")
STATUS = {"consumer": {"done": "done", "retry": "pending", "deferred": "pending", "dead": "dead"},
          "job": {"done": "done", "retry": "ready", "deferred": "ready", "dead": "failed"}}


def expected(case: str, kind: str) -> str:
    if case == "channel-paused-unstorable" and kind == "consumer":
        return "deferred"  # a RetryLater to the relay, which keeps no channel pauses
    return hostile.CASES[case][1]


@pytest.fixture
def rt(runtime, registry):
    hostile.register(registry)
    hostile.metadata.create_all(runtime.engine)
    return runtime


@pytest.fixture
def log_dir(tmp_path):
    """The operator log file, as a cron process writes it (without configure_logging, which would
    stop records reaching pytest's caplog in later tests)."""
    folder = tmp_path / "logs"
    handler = DailyFileHandler(folder)
    handler.setFormatter(UtcFormatter())
    logger = logging.getLogger(LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield folder
    logger.removeHandler(handler)
    logger.setLevel(level)
    handler.close()


def add_work(rt, cases: list[str]) -> None:
    """A hostile event and job per case, then a good event and a good job behind them."""
    with rt.sessions.begin() as session:
        for case in cases:
            cronbox.record(session, "hostile", {"case": case})
            hostile.work.dispatch(session, {"case": case})
        cronbox.record(session, "good", {})
        hostile.good_job.dispatch(session, {"n": 1})


def items(rt) -> dict[tuple[str, str], object]:
    """(kind, case) -> the delivery or job row of that hostile case."""
    with rt.sessions() as session:
        out = {}
        for d, payload in session.execute(
                select(Delivery, OutboxEvent.payload).join(OutboxEvent).where(Delivery.consumer == "hostile")):
            out[("consumer", load_payload(payload)["case"])] = d
        for j in session.scalars(select(Job).where(Job.handler == "hostile.job")):
            out[("job", load_payload(j.payload)["case"])] = j
        return out


def good_rows(rt) -> list[str]:
    with rt.sessions() as session:
        return sorted(session.scalars(select(hostile.rows.c.tag).where(hostile.rows.c.tag.like("good-%"))))


def check_item(row, kind: str, case: str, *, allowed: set[str] | None = None) -> None:
    outcome = expected(case, kind)
    wanted = {STATUS[kind][o] for o in (allowed or {outcome})}
    assert row.status in wanted, (kind, case, row.status, row.last_error)
    if row.status == "done":
        return
    assert row.attempts == (0 if outcome == "deferred" else 1), (kind, case)
    error = row.last_error
    if outcome == "deferred":
        return
    assert error and len(error) <= 1000 and "\n" not in error and "\r" not in error, (kind, case, error)
    error.encode("utf-8")  # storable and printable: no lone surrogates
    if kind == "job" and row.traceback is not None:
        row.traceback.encode("utf-8")


def check_log(folder: Path) -> str:
    text = "".join(path.read_bytes().decode("utf-8") for path in sorted(folder.glob("*.log")))
    for line in text.splitlines():
        assert LOG_LINE.match(line), f"not one entry per line: {line[:200]!r}"
    assert "9121234567" not in text.replace(" ", "") and hostile.EMAIL not in text
    return text


@pytest.mark.parametrize("case", sorted(hostile.CASES))
def test_a_hostile_handler_fails_only_its_own_item(rt, log_dir, case):
    add_work(rt, [case])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = run_tick(rt, run_command=main, linger=False, max_time=60, memory_mb=None)
        gc.collect()
    assert report.exit_code == 0, report.summary()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    rows = items(rt)
    allowed = {"done", "retry"} if case in hostile.PRINT_CASES else None  # pytest's capture may refuse it
    for kind in ("consumer", "job"):
        check_item(rows[(kind, case)], kind, case, allowed=allowed)
    assert good_rows(rt) == ["good-event", "good-job"]
    log = check_log(log_dir)
    assert "outcome=" in log
    if case == "surrogate":
        assert rows[("job", case)].last_error == "RuntimeError: oops \\udcff"
    if case == "phone-and-email":  # masked in the log; the full text only in the item's row
        assert hostile.PHONE in rows[("consumer", case)].last_error and "+98*******567" in log
    if case in ("async-def", "generator"):
        assert "body never ran" in rows[("job", case)].last_error


def test_every_hostile_handler_in_one_tick(rt, log_dir):
    """All of them back to back: none disturbs the next."""
    cases = sorted(hostile.CASES)
    add_work(rt, cases)
    report = run_tick(rt, run_command=main, linger=False, max_time=60, memory_mb=None)
    assert report.exit_code == 0, report.summary()
    rows = items(rt)
    for case in cases:
        for kind in ("consumer", "job"):
            check_item(rows[(kind, case)], kind, case,
                       allowed={"done", "retry"} if case in hostile.PRINT_CASES else None)
    assert good_rows(rt) == ["good-event", "good-job"]
    check_log(log_dir)


SUBPROCESS_CASES = ["surrogate", "surrogate-permanent", "str-raises", "enormous", "newlines", "phone-and-email",
                    "system-exit", "keyboard-interrupt", "own-base-exception", "async-def", "print-stdout",
                    "print-stderr", "channel-paused-unstorable"]


@pytest.mark.slow
@pytest.mark.parametrize("commands, encoding", [
    ([["tick", "--no-linger"]], {"PYTHONIOENCODING": "ascii"}),
    ([["outbox", "publish"], ["queue", "work", "--stop-when-empty"]], {"LANG": "C", "LC_ALL": "C"}),
], ids=["tick-ascii", "publish-work-C-locale"])
def test_hostile_handlers_in_a_cron_process(rt, env, tmp_path, commands, encoding):
    """The real process: its exit code, and stdout/stderr that cannot encode what handlers print."""
    add_work(rt, SUBPROCESS_CASES)
    for args in commands:
        proc = run_cli({**env, "CRONBOX_HANDLERS": "tests.handlers.hostile"}, *args, **encoding)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    rows = items(rt)
    for case in SUBPROCESS_CASES:
        for kind in ("consumer", "job"):
            check_item(rows[(kind, case)], kind, case)
    assert good_rows(rt) == ["good-event", "good-job"]
    check_log(tmp_path / "instance" / "logs")


def test_the_same_item_does_not_crash_the_next_tick_either(rt):
    """Before: the item stayed reserved and every tick after its lease crashed on it again."""
    add_work(rt, ["surrogate"])
    start = clock.utcnow()
    for hours in (0, 1):  # the second tick runs after the retry's backoff (600 s)
        with clock.frozen(start + timedelta(hours=hours)):
            report = run_tick(rt, run_command=main, linger=False, max_time=60, memory_mb=None)
        assert report.exit_code == 0, report.summary()
    rows = items(rt)
    assert rows[("job", "surrogate")].attempts == 2 and rows[("consumer", "surrogate")].attempts == 2


# -- real signals keep their meaning ---------------------------------------------------------------

def test_a_real_ctrl_c_still_interrupts_a_library_run_but_a_raised_one_is_a_failure(rt):
    """Outside a cron run (no StopSignals), Ctrl-C raises inside the handler: the run stops, as
    before. A handler raising KeyboardInterrupt itself only fails its attempt."""
    add_work(rt, ["keyboard-interrupt"])
    Worker(rt, ["hostile"]).run(Budget(max_time=30, memory_mb=None))
    assert items(rt)[("job", "keyboard-interrupt")].status == "ready"

    @job("real", name="real-sigint", registry=rt.registry)
    def real(payload, ctx):
        signal.raise_signal(signal.SIGINT)

    with rt.sessions.begin() as session:
        real.dispatch(session, {})
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            Worker(rt, ["real"]).run(Budget(max_time=30, memory_mb=None))
    finally:
        signal.signal(signal.SIGINT, previous)
    with rt.sessions() as session:  # interrupted mid-attempt: left to its lease, as before
        assert session.scalars(select(Job.status).where(Job.handler == "real-sigint")).one() == "reserved"


# -- ctx.session cannot end the transaction that carries the ack ------------------------------------

def _put(ctx, tag: str, row_id: int) -> None:
    ctx.session.execute(insert(hostile.rows).values(id=row_id, tag=tag))


def _duplicate(ctx) -> None:
    from sqlalchemy.exc import IntegrityError

    try:
        _put(ctx, "dup", 1)
    except IntegrityError:
        pass


def _orm_duplicate(ctx) -> None:
    """An ORM flush that fails: SQLAlchemy itself refuses the session until rollback()."""
    from sqlalchemy.exc import IntegrityError

    ctx.session.add(hostile.Row(id=1, tag="orm-dup"))
    try:
        ctx.session.flush()
    except IntegrityError:
        pass


def _nested_duplicate(ctx) -> None:
    from sqlalchemy.exc import IntegrityError

    try:
        with ctx.session.begin_nested():
            _put(ctx, "dup", 1)
    except IntegrityError:
        pass


def _fail(ctx) -> None:
    raise RuntimeError("after writing")


def _steps(*steps):
    def run(ctx):
        for step in steps:
            step(ctx)
    return run


A = lambda ctx: _put(ctx, "A", 1)  # noqa: E731
B = lambda ctx: _put(ctx, "B", 3)  # noqa: E731
COMMIT = lambda ctx: ctx.session.commit()  # noqa: E731
ROLLBACK = lambda ctx: ctx.session.rollback()  # noqa: E731
CLOSE = lambda ctx: ctx.session.close()  # noqa: E731
COMMIT_NOW = lambda ctx: ctx.commit_now()  # noqa: E731


def _caught(step):
    """`step`, its PendingRollbackError caught (a handler going on after commit() refused)."""
    def run(ctx):
        with pytest.raises(PendingRollbackError, match="call ctx.session.rollback"):
            step(ctx)
    return run

# case -> (steps, outcome, rows kept)
SESSION_CASES = {
    "commit-then-write": (_steps(A, COMMIT, B), "done", ["A", "B"]),
    "commit-then-fail": (_steps(A, COMMIT, B, _fail), "retry", []),
    "commit-twice-then-fail": (_steps(A, COMMIT, COMMIT, _fail), "retry", []),
    "rollback": (_steps(A, ROLLBACK, B), "done", ["B"]),
    "commit-then-rollback": (_steps(A, COMMIT, B, ROLLBACK), "done", ["A"]),
    "close": (_steps(A, CLOSE, B), "done", ["B"]),
    "close-at-the-end": (_steps(A, CLOSE), "done", []),
    "caught-integrity-error": (_steps(A, _duplicate), "retry", []),
    "caught-integrity-error-then-commit": (_steps(A, _duplicate, COMMIT), "retry", []),
    # commit() on a failed session raises (nothing of it kept, on every backend); rollback() then goes on.
    "caught-integrity-error-then-caught-commit-then-rollback": (
        _steps(A, _duplicate, _caught(COMMIT), ROLLBACK, B), "done", ["B"]),
    "caught-integrity-error-then-rollback": (_steps(A, _duplicate, ROLLBACK, B), "done", ["B"]),
    "caught-in-begin-nested": (_steps(A, _nested_duplicate, B), "done", ["A", "B"]),
    "caught-orm-flush-error": (_steps(A, _orm_duplicate), "retry", []),
    "caught-orm-flush-error-then-rollback": (_steps(A, _orm_duplicate, ROLLBACK, B), "done", ["B"]),
    "commit-now-then-fail": (_steps(A, COMMIT_NOW, B, _fail), "retry", ["A"]),
    "rollback-then-commit-now": (_steps(A, ROLLBACK, B, COMMIT_NOW), "done", ["B"]),
}


@pytest.mark.parametrize("kind", ["consumer", "job"])
@pytest.mark.parametrize("case", sorted(SESSION_CASES))
def test_what_a_handler_does_to_ctx_session(runtime, registry, case, kind):
    steps, outcome, kept = SESSION_CASES[case]
    hostile.metadata.create_all(runtime.engine)
    hostile.register(registry)
    consumer("session", name="session", backoff=[600], registry=registry)(lambda event, ctx: steps(ctx))
    job("session", name="session", backoff=[600], registry=registry)(lambda payload, ctx: steps(ctx))
    with runtime.sessions.begin() as session:
        if kind == "consumer":
            cronbox.record(session, "session", {})
        else:
            registry.jobs.get("session").dispatch(session, {})
        cronbox.record(session, "good", {})
        hostile.good_job.dispatch(session, {"n": 1})
    relay = Relay(runtime)
    relay.run(Budget(max_time=30, memory_mb=None))
    Worker(runtime, ["session", "good"]).run(Budget(max_time=30, memory_mb=None))
    with runtime.sessions() as session:
        tags = sorted(session.scalars(select(hostile.rows.c.tag)))
        if kind == "consumer":
            row = session.scalars(select(Delivery).where(Delivery.consumer == "session")).one()
        else:
            row = session.scalars(select(Job).where(Job.handler == "session")).one()
    assert row.status == STATUS[kind][outcome], (row.status, row.last_error)
    assert tags == sorted(kept + ["good-event", "good-job"])
    if case.startswith("caught-") and outcome == "retry":
        assert "ctx.session failed" in row.last_error  # left failed, or commit() refused while it was
