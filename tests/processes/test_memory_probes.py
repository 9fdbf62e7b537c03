"""The memory probes (outbox.core.resources) in processes of their own, started as cron starts a
worker: each call's peak, the reset mark, and a forked child's own memory. Processes, so not in the
units tier."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MiB = 2 ** 20


PEAK_CHILD = """
from cronbox.outbox.core.resources import PROBE, PeakProbe, peak_rss_kb
probe = PeakProbe()
for mb in (60, 10):
    before = PROBE.rss_kb()
    probe.start()
    data = bytearray(b"1") * (mb * 2 ** 20)
    del data
    print(probe.peak_kb() - before, end=" ")
print(peak_rss_kb())
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="no /proc/self/clear_refs")
def test_the_peak_of_each_call_is_seen_even_under_a_larger_parents_peak():
    """A process started by a large one begins with its parent's peak in ru_maxrss (kept over exec):
    the probe then reads this program's own mark, reset before each call, so a 10 MB call after a
    60 MB one is 10 MB, not hidden."""
    ballast = bytearray(b"1") * (200 * MiB)  # this test process is now the large parent
    out = subprocess.run([sys.executable, "-c", PEAK_CHILD], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])}).stdout.split()
    del ballast
    first, second, inherited = (int(x) for x in out)
    assert inherited >= 200 * 1024  # ru_maxrss alone would have shown neither call
    assert 58 * 1024 <= first <= 64 * 1024 and 9 * 1024 <= second <= 13 * 1024, out


def run_as_cron_does(script: str) -> list[str]:
    """`script` in a Python started through /bin/sh, not exec'd by it, as cron starts a worker: its
    ru_maxrss is then its own (a child exec'd straight from this large test process would start
    with this process's peak in it, as PEAK_CHILD does)."""
    return subprocess.run(["/bin/sh", "-c", '"$0" "$@"; exit $?', sys.executable, "-c", script], capture_output=True,
                          text=True, check=True, env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
                          ).stdout.split()


OWN_PEAK_CHILD = """
from cronbox.outbox.core.resources import PROBE, PeakProbe
probe = PeakProbe()
PROBE.rss_kb()  # its file opened before the loop
for mb in (30, 5):
    before = probe.start()
    statm = PROBE.rss_kb()
    data = bytearray(b"1") * (mb * 2 ** 20)
    del data
    print(probe._way, statm - before, probe.peak_kb() - before, end=" ")
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="no /proc/self/clear_refs")
def test_the_reset_gives_the_rss_it_reset_the_mark_to():
    """Where ru_maxrss is the program's own, ru_maxrss right after the reset is the RSS then: one
    getrusage gives the call's starting point (no read of /proc/self/statm)."""
    out = run_as_cron_does(OWN_PEAK_CHILD)
    assert out[0] == "ru_maxrss" and out[3] == "ru_maxrss", out  # the cheap way, not VmHWM
    for gap, growth, mb in ((int(out[1]), int(out[2]), 30), (int(out[4]), int(out[5]), 5)):
        assert abs(gap) <= 1024, out  # statm read just after: the same (the kernel folds its per-CPU counts late)
        assert (mb - 2) * 1024 <= growth <= (mb + 4) * 1024, out


FORK_CHILD = """
import os
from cronbox.outbox.core.resources import PROBE, PeakProbe
probe = PeakProbe()
probe.start()
parent = PROBE.rss_kb()
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child: its own statm, its own peak mark
    os.close(read)
    start = PROBE.rss_kb()
    ballast = bytearray(b"1") * (40 * 2 ** 20)
    grown = PROBE.rss_kb() - start
    del ballast  # the child's peak is now 40 MB above its RSS
    before = probe.start()
    data = bytearray(b"1") * (5 * 2 ** 20)
    del data
    os.write(write, f"{grown} {probe.peak_kb() - before}".encode())
    os._exit(0)
os.close(write)
os.waitpid(pid, 0)
print(os.read(read, 100).decode(), PROBE.rss_kb() - parent)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="no /proc/self/clear_refs")
def test_a_forked_child_reads_its_own_memory_not_its_parents():
    """An fd opened through /proc/self names its opener: after a fork the probes reopen theirs (told by
    os.register_at_fork), so a pool child's RSS and its calls' peaks are its own, not the parent's."""
    grown, growth, parent_moved = (int(x) for x in run_as_cron_does(FORK_CHILD))
    assert grown >= 38 * 1024  # the child's 40 MB, seen in the child's statm
    assert 3 * 1024 <= growth <= 9 * 1024  # its mark was reset (not the parent's): 5 MB, not 40
    assert abs(parent_moved) < 4 * 1024  # the parent's own RSS never saw the child's ballast
