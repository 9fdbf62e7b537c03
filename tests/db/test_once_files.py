"""Run-once request files that are not regular files (issue 12): refused with a reason, never followed,
never blocking the tick. On every backend."""
from __future__ import annotations

import json
import os
import stat
import threading
import time

import pytest
from sqlalchemy import select

from cronbox.cron.cli import main
from cronbox.cron.scheduling import once
from cronbox.cron.scheduling.models import OnceRequest
from tests.conftest import ONE_MYSQL_MODE

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)
OLD = 60  # seconds: ripe


def _age(path, seconds: float = OLD) -> None:
    stamp = time.time() - seconds
    os.utime(path, (stamp, stamp), follow_symlinks=False)


def _make(kind: str, inbox, tmp_path):
    """An inbox entry x.cmd of this kind; returns (path, what must stay untouched)."""
    path = inbox / "x.cmd"
    outside = tmp_path / "outside" / "real.cmd"
    outside.parent.mkdir()
    outside.write_bytes(b"queue status\n")
    if kind == "symlink-to-valid":
        target = inbox / "real.txt"
        target.write_bytes(b"queue status\n")
        path.symlink_to(target)
    elif kind == "symlink-outside":
        path.symlink_to(outside)
    elif kind == "symlink-to-dev":
        path.symlink_to("/dev/zero")
    elif kind == "dangling":
        path.symlink_to(tmp_path / "nowhere.cmd")
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "folder":
        path.mkdir()
        (path / "inner.cmd").write_bytes(b"queue status\n")
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("mknod of a device needs root")
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # what /dev/null is
    _age(path)
    return path, outside


def _run_bounded(work, fifo=None):
    """Run `work` in a thread; if it blocks (a FIFO's open waiting for a writer), unblock it and fail."""
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("result", work()), daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked reader go
        thread.join(10)
        pytest.fail("reading the run-once inbox blocked")
    return outcome.get("result")


def _requests(runtime) -> dict[str, OnceRequest]:
    with runtime.sessions() as session:
        return {r.source: r for r in session.scalars(select(OnceRequest))}


@pytest.mark.parametrize("kind", ["symlink-to-valid", "symlink-outside", "symlink-to-dev", "dangling", "fifo",
                                  "folder", "device"])
def test_an_entry_that_is_not_a_regular_file_is_refused_and_the_rest_runs(runtime, settings, tmp_path, kind, caplog):
    caplog.set_level("INFO", logger="cronbox")
    inbox = settings.instance / "run-once"
    inbox.mkdir(parents=True)
    path, outside = _make(kind, inbox, tmp_path)
    good = inbox / "z-good.cmd"
    good.write_bytes(b"queue status\n")
    _age(good)

    collected, ran = _run_bounded(lambda: once.run_locked(runtime, main), fifo=path if kind == "fifo" else None)

    requests = _requests(runtime)
    refused = requests["file:x.cmd"]
    assert refused.status == "refused" and refused.reason.startswith("not a regular file"), refused.reason
    assert json.loads(refused.argv) == []
    assert requests["file:z-good.cmd"].status == "done"
    assert (collected, ran) == (2, 1)
    assert not os.path.lexists(path)  # taken into the archive: not found again every tick
    assert outside.read_bytes() == b"queue status\n"  # a link's target is never read, moved or changed
    assert "from file x.cmd is refused (not a regular file" in caplog.text


@pytest.mark.parametrize("kind", ["fifo", "symlink-outside", "folder"])
def test_migrate_before_the_tick_ignores_what_is_not_a_regular_file(runtime, settings, tmp_path, kind):
    inbox = settings.instance / "run-once"
    inbox.mkdir(parents=True)
    path, outside = _make(kind, inbox, tmp_path)
    if kind == "symlink-outside":
        outside.write_bytes(b"migrate\n")
    assert _run_bounded(lambda: once.migrate_from_file(runtime, main), fifo=path if kind == "fifo" else None) is False
    assert os.path.lexists(path)  # left for the normal collection, which refuses it with the reason
