"""The memory limit the kernel puts on this process's group, and how much of it is in use.

Read from the cgroup files of the group this process is in (/proc/self/cgroup names it):
cgroup v2 `memory.max` / `memory.current`, else v1 `memory.limit_in_bytes` / `memory.usage_in_bytes`.
Every level from the process's group up to the mount's root is read, because a parent's limit
holds for all its children together: the smallest headroom (limit - in use) of any level wins.
"In use" leaves out the page cache the kernel can drop (`inactive_file` in memory.stat), as the
kernel does before it kills anything; that is also what `docker stats` reports.

CloudLinux LVE: the account's PMEM limit, where its kernel keeps it in cgroups (CloudLinux 8+
lve kernels with cgroup v2) is read above. /proc/lve/list exists on LVE kernels and is readable by
root only on most of them; where this process can read it (some kernels show an LVE its own row),
`lve_limit` takes the row of the LVE whose id is this process's uid (an account's LVE id is its
uid) and its lMEMPHY / MEMPHY columns (pages), found by the header line's names, as the columns
moved between versions ("6:LVE EP lCPU ..." / "8:LVE ..."). /var/lve/info, a 5-minute snapshot
written by lve-stats for control panels, is too old to admit work by and is not read. When nothing
is readable, the answer is "no limit known" and health checks nothing. CRONBOX_LVE_LIST (default
/proc/lve/list) says where the file is (the tests point it at a file of their own).

CRONBOX_CGROUP_ROOT (default /sys/fs/cgroup) only says where the cgroup files are mounted (the
tests point it at a folder of their own); the path of the process's group still comes from
/proc/self/cgroup.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

DEFAULT_ROOT = "/sys/fs/cgroup"
DEFAULT_LVE_LIST = "/proc/lve/list"
LVE_PAGE = 4096  # /proc/lve/list counts memory in 4 KiB pages
UNLIMITED_V1 = 1 << 60  # v1 says "no limit" with a huge number (PAGE_COUNTER_MAX pages, ~2**63)


@dataclass(frozen=True)
class MemoryLimit:
    limit: int  # bytes
    used: int  # bytes, reclaimable page cache left out
    source: str  # e.g. "cgroup v2 /sys/fs/cgroup/user.slice"

    @property
    def headroom(self) -> int:
        return max(self.limit - self.used, 0)

    @property
    def share_used(self) -> float:
        return self.used / self.limit if self.limit else 1.0


def memory_limit(root: str | Path = DEFAULT_ROOT, proc_cgroup: str | Path = "/proc/self/cgroup") -> MemoryLimit | None:
    """The tightest limit over this process's groups, or None when none is set or none can be read."""
    groups = cgroup_paths(proc_cgroup)
    root = Path(root)
    found = _v2(root, groups.get("v2"))
    if found is None:
        found = _v1(root / "memory", groups.get("memory"))
    return found


def cgroup_paths(proc_cgroup) -> dict[str, str]:
    """{"v2": path, "memory": path} from /proc/self/cgroup's "id:controllers:path" lines."""
    try:
        text = Path(proc_cgroup).read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            out["v2"] = path
        elif "memory" in controllers.split(","):
            out["memory"] = path
    return out


def _levels(mount: Path, path: str | None) -> list[Path]:
    """The group's folder and each parent up to the mount; only the mount when the group's folder is
    not under it (a cgroup namespace shows its own root as "/" and mounts it there)."""
    if not mount.is_dir():
        return []
    parts = [p for p in PurePosixPath(path or "/").parts if p != "/"]
    levels = [mount.joinpath(*parts[:depth]) for depth in range(len(parts), 0, -1)]
    return [level for level in levels if level.is_dir()] + [mount]


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # missing, "max", unreadable
        return None


def _reclaimable(stat_file: Path, name: str) -> int:
    try:
        for line in stat_file.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _tightest(candidates: list[MemoryLimit]) -> MemoryLimit | None:
    return min(candidates, key=lambda c: c.headroom, default=None)


def _v2(mount: Path, path: str | None) -> MemoryLimit | None:
    if path is None:
        return None
    found = []
    for level in _levels(mount, path):
        limit, current = _number(level / "memory.max"), _number(level / "memory.current")
        if limit is None or current is None:
            continue
        used = max(current - _reclaimable(level / "memory.stat", "inactive_file"), 0)
        found.append(MemoryLimit(limit, used, f"cgroup v2 {level}"))
    return _tightest(found)


def _v1(mount: Path, path: str | None) -> MemoryLimit | None:
    if path is None:
        return None
    found = []
    for level in _levels(mount, path):
        limit, usage = _number(level / "memory.limit_in_bytes"), _number(level / "memory.usage_in_bytes")
        if limit is None or usage is None or limit >= UNLIMITED_V1:
            continue
        used = max(usage - _reclaimable(level / "memory.stat", "total_inactive_file"), 0)
        found.append(MemoryLimit(limit, used, f"cgroup v1 {level}"))
    return _tightest(found)


def lve_limit(path: str | Path = DEFAULT_LVE_LIST, lve_id: int | None = None) -> MemoryLimit | None:
    """The physical-memory limit (lMEMPHY) and use (MEMPHY) of this account's LVE from /proc/lve/list,
    or None when the file is missing or unreadable, has no row for the LVE, or sets no limit (0)."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if not lines:
        return None
    names = lines[0].split(":", 1)[-1].split()  # "8:LVE EP lCPU ..." -> ["LVE", "EP", "lCPU", ...]
    try:
        column_id, column_limit, column_used = (names.index(n) for n in ("LVE", "lMEMPHY", "MEMPHY"))
    except ValueError:
        return None
    wanted = str(os.getuid() if lve_id is None else lve_id)
    for line in lines[1:]:
        fields = line.split()
        if len(fields) > max(column_id, column_limit, column_used) and fields[column_id] == wanted:
            try:
                limit, used = int(fields[column_limit]) * LVE_PAGE, int(fields[column_used]) * LVE_PAGE
            except ValueError:
                return None
            return MemoryLimit(limit, used, f"LVE {wanted} {path}") if limit > 0 else None
    return None


def process_limit(root: str | Path = DEFAULT_ROOT, lve_list: str | Path = DEFAULT_LVE_LIST) -> MemoryLimit | None:
    """The tightest of the cgroup limit and the LVE limit, whichever the kernel lets this process read."""
    return _tightest([found for found in (memory_limit(root), lve_limit(lve_list)) if found is not None])
