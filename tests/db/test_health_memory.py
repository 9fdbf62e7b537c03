"""The memory check in a full health run: a cgroup, or a readable CloudLinux LVE, close to its limit
fails health and alerts."""
from __future__ import annotations

import os

import pytest

from cronbox.cron.scheduling import health
from cronbox.outbox.core.memlimit import cgroup_paths
from cronbox.outbox.core.settings import load_settings
from cronbox.outbox.engine.runtime import Runtime
from tests.conftest import ONE_MYSQL_MODE

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)
MiB = 2 ** 20


@pytest.mark.skipif("v2" not in cgroup_paths("/proc/self/cgroup"), reason="no cgroup v2 line in /proc/self/cgroup")
def test_a_cgroup_near_its_limit_fails_health(env, runtime, tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.max").write_text(f"{1024 * MiB}\n")
    (root / "memory.current").write_text(f"{1000 * MiB}\n")
    rt = Runtime(load_settings(environ={**env, "CRONBOX_CGROUP_ROOT": str(root),
                                        "CRONBOX_LVE_LIST": str(tmp_path / "none")}), registry=runtime.registry)
    try:
        report = health.run_checks(rt)
        memory = {c.name: c for c in report.checks}["memory"]
        assert memory.status == "fail" and memory.value == 24 and report.status == "fail"
        assert health.alert_on(rt, report).count("fail:memory") == 1
        (root / "memory.current").write_text(f"{100 * MiB}\n")
        memory = {c.name: c for c in health.run_checks(rt).checks}["memory"]
        assert memory.status == "ok" and "924 MiB headroom" in memory.detail
    finally:
        rt.dispose()


LVE_HEADER = "8:LVE EP lCPU lIO CPU MEM IO lMEM lEP nCPU fMEM fEP lMEMPHY lCPUW lNPROC MEMPHY fMEMPHY\n"


def lve_row(lve_id: int, limit_pages: int, used_pages: int) -> str:
    return f"{lve_id} 0 100 0 0 0 0 0 20 1 0 0 {limit_pages} 0 100 {used_pages} 0 0\n"


def test_an_lve_near_its_limit_fails_health_where_the_list_is_readable(env, runtime, tmp_path):
    """No cgroup limit to be seen, as on CloudLinux 7 (LVEs outside cgroups): the account's row of
    /proc/lve/list (its uid) is the limit health checks, as admission does; another LVE's row is not."""
    lve = tmp_path / "list"
    uid = os.getuid()
    lve.write_text(LVE_HEADER + lve_row(uid + 1, 262144, 1000) + lve_row(uid, 65536, 64000))  # 256 MiB, 250 used
    rt = Runtime(load_settings(environ={**env, "CRONBOX_CGROUP_ROOT": str(tmp_path / "no-cgroup"),
                                        "CRONBOX_LVE_LIST": str(lve)}), registry=runtime.registry)
    try:
        report = health.run_checks(rt)
        memory = {c.name: c for c in report.checks}["memory"]
        assert memory.status == "fail" and memory.value == 6 and report.status == "fail"
        assert f"LVE {uid}" in memory.detail and "250 of 256 MiB in use" in memory.detail
        assert health.alert_on(rt, report).count("fail:memory") == 1
        lve.write_text(LVE_HEADER + lve_row(uid, 65536, 25600))  # 100 MiB used
        memory = {c.name: c for c in health.run_checks(rt).checks}["memory"]
        assert memory.status == "ok" and "156 MiB headroom" in memory.detail
        lve.write_text(LVE_HEADER + lve_row(uid + 1, 65536, 64000))  # only another account's row: no limit known
        assert "memory" not in {c.name for c in health.run_checks(rt).checks}
    finally:
        rt.dispose()
