"""Memory headroom under the cgroup limit (outbox.core.memlimit) and the health check on it, read from
a cgroup folder of the test's own (CRONBOX_CGROUP_ROOT), laid out as the kernel lays it out for
this very process (the group path comes from the real /proc/self/cgroup)."""
from __future__ import annotations

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

