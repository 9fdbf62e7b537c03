"""Memory headroom under the cgroup limit (outbox.core.memlimit) and the health check on it, read from
a cgroup folder of the test's own (CRONBOX_CGROUP_ROOT), laid out as the kernel lays it out for
this very process (the group path comes from the real /proc/self/cgroup)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from cronbox.cron.scheduling import health
from cronbox.outbox.core.memlimit import cgroup_paths, memory_limit
from cronbox.outbox.core.settings import load_settings

MiB = 2 ** 20
GROUPS = cgroup_paths("/proc/self/cgroup")


def group_folder(mount: Path, controller: str) -> Path:
    """Where the kernel keeps this process's group under `mount` (made here, parents too)."""
    parts = [p for p in PurePosixPath(GROUPS.get(controller) or "/").parts if p != "/"]
    folder = mount.joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text + "\n")


def settings_for(tmp_path, root: Path, **extra: str):
    return load_settings(environ={"CRONBOX_INSTANCE": str(tmp_path / "instance"), "CRONBOX_HANDLERS": "",
                                  "CRONBOX_CGROUP_ROOT": str(root), "CRONBOX_LVE_LIST": str(tmp_path / "no-lve"),
                                  **extra})


def memory(tmp_path, root: Path, **extra: str):
    found = [c for c in health._memory_checks(settings_for(tmp_path, root, **extra)) if c.name == "memory"]
    return found[0] if found else None


@pytest.mark.skipif("v2" not in GROUPS, reason="this process has no cgroup v2 line in /proc/self/cgroup")
def test_cgroup_v2_limit_headroom_and_the_page_cache_left_out(tmp_path):
    root = tmp_path / "cgroup"
    write(root, memory_max=str(1024 * MiB), memory_current=str(700 * MiB),
          memory_stat=f"anon {500 * MiB}\nfile {200 * MiB}\ninactive_file {100 * MiB}\n")
    found = memory_limit(root)
    assert (found.limit, found.used, found.headroom) == (1024 * MiB, 600 * MiB, 424 * MiB)
    assert found.source == f"cgroup v2 {root}"
    check = memory(tmp_path, root)
    assert check.status == "ok" and check.value == 424 and "600 of 1,024 MiB in use (59%)" in check.detail
    write(root, memory_current=str(930 * MiB))  # 830 MiB without the cache: 81 %
    assert memory(tmp_path, root).status == "warn"
    write(root, memory_current=str(1100 * MiB))  # 98 %
    assert memory(tmp_path, root).status == "fail"
    assert memory(tmp_path, root, CRONBOX_MEMORY_FAIL="99%").status == "warn"
    assert memory(tmp_path, root, CRONBOX_MEMORY_WARN="99", CRONBOX_MEMORY_FAIL="100").status == "ok"


def test_a_parents_tighter_limit_wins_over_the_groups_own(tmp_path):
    """A process in a nested group (as systemd puts a user's cron jobs), named by a cgroup file of its own."""
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/user.slice/user-1000.slice/cron.service\n")
    root = tmp_path / "cgroup"
    own = root / "user.slice" / "user-1000.slice" / "cron.service"
    write(own, memory_max="max", memory_current=str(300 * MiB))
    write(own.parent, memory_max=str(512 * MiB), memory_current=str(480 * MiB))
    write(root / "user.slice", memory_max=str(4096 * MiB), memory_current=str(900 * MiB))
    write(root, memory_max="max", memory_current=str(2000 * MiB))
    found = memory_limit(root, proc)
    assert (found.limit, found.used, found.source) == (512 * MiB, 480 * MiB, f"cgroup v2 {own.parent}")
    write(root / "user.slice", memory_current=str(4080 * MiB))  # the grandparent has less room left now
    assert memory_limit(root, proc).headroom == 16 * MiB


def test_cgroup_v1_limit_and_its_no_limit_number(tmp_path):
    root = tmp_path / "cgroup"
    mount = root / "memory"
    folder = group_folder(mount, "memory") if "memory" in GROUPS else mount
    write(folder, memory_limit_in_bytes=str(256 * MiB), memory_usage_in_bytes=str(250 * MiB),
          memory_stat=f"cache {10 * MiB}\ntotal_inactive_file {6 * MiB}\n")
    found = memory_limit(root)
    if "memory" not in GROUPS:
        assert found is None  # no memory controller line: nothing to read
        return
    assert (found.limit, found.used) == (256 * MiB, 244 * MiB) and found.source.startswith("cgroup v1 ")
    assert memory(tmp_path, root).status == "fail"
    write(folder, memory_limit_in_bytes="9223372036854771712")  # v1's "unlimited"
    assert memory_limit(root) is None and memory(tmp_path, root) is None


def test_no_limit_known_means_no_check(tmp_path):
    root = tmp_path / "cgroup"
    assert memory_limit(tmp_path / "missing") is None and memory(tmp_path, tmp_path / "missing") is None
    write(root, memory_max="max", memory_current=str(100 * MiB))  # v2 with no limit anywhere
    assert memory_limit(root) is None and memory(tmp_path, root) is None
    write(root, memory_max="garbage", memory_current="12")
    assert memory(tmp_path, root) is None


@pytest.mark.parametrize("name, value", [("CRONBOX_MEMORY_WARN", "lots"), ("CRONBOX_MEMORY_FAIL", "150"),
                                         ("CRONBOX_MEMORY_WARN", "0")])
def test_a_bad_threshold_is_a_warning_saying_which_setting(tmp_path, name, value):
    check = memory(tmp_path, tmp_path, **{name: value})
    assert check.status == "warn" and name in check.detail and "\n" not in check.detail


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
