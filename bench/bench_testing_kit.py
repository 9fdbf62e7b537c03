"""A user's test of a consumer that dispatches a follow-up job, drained, on SQLite: with cronbox.testing
(in the test's process) beside the same test written with cronbox's command line (a `python -m cronbox
tick --no-linger` subprocess), timed by pytest itself (issue 38: "well under a second").

    python bench/bench_testing_kit.py [--tree /work/main] [--tests 20]

The script writes a small user project into a temporary folder (its handlers, a conftest giving each test
a fresh SQLite database copied from one migrated per session, as a user's suite would, and the two test
files) and runs pytest on it in a subprocess, cronbox taken from `--tree` (the plugin named with -p: the
tree is not installed). Each test: commit an event in the user's own session, run what follows it
(the consumer, then the job it dispatched), check that the job is done and wrote its row. Reported per
variant: the median and min-max of the test's call, and of setup + call + teardown (pytest's own
--durations), over `--tests` tests each.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from collections import defaultdict
from pathlib import Path

HANDLERS = '''
from sqlalchemy import Column, Integer, MetaData, Table, insert

from cronbox import consumer, job

metadata = MetaData()
shipped = Table("shop_shipped", metadata, Column("id", Integer, primary_key=True), Column("order_id", Integer))


@consumer("order.placed", name="shop.confirm")
def confirm(event, ctx):
    ship.dispatch(ctx.session, {"order": event.payload["order"]})


@job("shipping", name="shop.ship")
def ship(payload, ctx):
    ctx.session.execute(insert(shipped).values(order_id=payload["order"]))
'''

CONFTEST = '''
import sqlite3

import pytest


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    """cronbox's tables and the shop's, made once per session; each test gets a copy."""
    from cronbox.outbox import load_settings, open_runtime
    from shop import metadata

    folder = tmp_path_factory.mktemp("template")
    runtime = open_runtime(settings=load_settings(environ={
        "DATABASE_URL": f"sqlite:///{folder}/shop.db", "CRONBOX_HANDLERS": "shop", "CRONBOX_INSTANCE": str(folder)}))
    metadata.create_all(runtime.engine)
    runtime.dispose()
    return folder / "shop.db"


@pytest.fixture
def settings_env(tmp_path, template):
    source, copy = sqlite3.connect(template), sqlite3.connect(tmp_path / "shop.db")
    source.backup(copy)
    source.close()
    copy.close()
    return {"DATABASE_URL": f"sqlite:///{tmp_path}/shop.db", "CRONBOX_HANDLERS": "shop",
            "CRONBOX_INSTANCE": str(tmp_path / "instance")}


@pytest.fixture
def cronbox_app(settings_env):
    from cronbox.outbox import Runtime, load_settings

    runtime = Runtime(load_settings(environ=settings_env))
    yield runtime
    runtime.dispose()
'''

TEST_KIT = '''
import pytest

from cronbox import record
from shop import ship


@pytest.mark.parametrize("n", range({tests}))
def test_with_the_kit(n, cronbox_kit, cronbox_app):
    with cronbox_app.sessions.begin() as session:  # the user's transaction
        record(session, "order.placed", {{"order": n}})
    cronbox_kit.deliver()
    cronbox_kit.drain()
    [job] = cronbox_kit.assert_dispatched(ship, order=n)
    assert job.done
'''

TEST_CLI = '''
import os
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import sessionmaker

from cronbox import record
from shop import shipped


@pytest.mark.parametrize("n", range({tests}))
def test_with_the_command_line(n, settings_env):
    engine = create_engine(settings_env["DATABASE_URL"])
    with sessionmaker(engine).begin() as session:  # the user's transaction
        record(session, "order.placed", {{"order": n}})
    done = subprocess.run([sys.executable, "-m", "cronbox", "tick", "--no-linger"], env={{**os.environ, **settings_env}},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with engine.connect() as connection:
        assert connection.execute(select(shipped.c.order_id)).scalars().all() == [n]
        status = connection.exec_driver_sql("SELECT status FROM cronbox_jobs").scalars().all()
        assert status == ["done"]
    engine.dispose()
'''

DURATION = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+\S+::(test_\w+)\[(\d+)\]")


def write_project(root: Path, tests: int) -> None:
    (root / "shop.py").write_text(textwrap.dedent(HANDLERS))
    (root / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (root / "test_kit.py").write_text(textwrap.dedent(TEST_KIT).format(tests=tests))
    (root / "test_cli.py").write_text(textwrap.dedent(TEST_CLI).format(tests=tests))
    (root / "pytest.ini").write_text("[pytest]\n")


def run(root: Path, tree: Path) -> dict[str, dict[int, dict[str, float]]]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tree}:{root}", "HOME": str(root), "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "cronbox.testing.plugin", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-q", "--durations=0", "-vv", "test_kit.py", "test_cli.py"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"the project's tests failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    phases: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for line in done.stdout.splitlines():
        match = DURATION.match(line.strip())
        if match:
            seconds, phase, test, n = match.groups()
            phases[test][int(n)][phase] = float(seconds)
    return phases


def row(name: str, per_test: dict[int, dict[str, float]]) -> str:
    calls = [p.get("call", 0.0) for p in per_test.values()]
    totals = [sum(p.values()) for p in per_test.values()]
    return (f"| {name} | {len(calls)} | {statistics.median(calls) * 1000:.0f} ms | "
            f"{min(calls) * 1000:.0f}-{max(calls) * 1000:.0f} ms | {statistics.median(totals) * 1000:.0f} ms | "
            f"{min(totals) * 1000:.0f}-{max(totals) * 1000:.0f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the cronbox checkout to run (default: this one)")
    parser.add_argument("--tests", type=int, default=20, help="tests per variant")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cronbox-bench-kit-") as folder:
        root = Path(folder)
        write_project(root, args.tests)
        phases = run(root, args.tree.resolve())
    print("| test written with | tests | call, median | call, min-max | setup+call+teardown, median | min-max |")
    print("|---|---|---|---|---|---|")
    print(row("cronbox.testing (deliver, drain)", phases["test_with_the_kit"]))
    print(row("python -m cronbox tick (subprocess)", phases["test_with_the_command_line"]))


if __name__ == "__main__":
    main()
