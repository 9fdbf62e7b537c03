"""The memory check in a full health run: a cgroup close to its limit fails health and alerts."""
from __future__ import annotations

import pytest

from cron.scheduling import health
from outbox.core.memlimit import cgroup_paths
from outbox.core.settings import load_settings
from outbox.engine.runtime import Runtime
from tests.conftest import ONE_MYSQL_MODE

pytestmark = pytest.mark.backends(*ONE_MYSQL_MODE)
MiB = 2 ** 20


@pytest.mark.skipif("v2" not in cgroup_paths("/proc/self/cgroup"), reason="no cgroup v2 line in /proc/self/cgroup")
def test_a_cgroup_near_its_limit_fails_health(env, runtime, tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.max").write_text(f"{1024 * MiB}\n")
    (root / "memory.current").write_text(f"{1000 * MiB}\n")
    rt = Runtime(load_settings(environ={**env, "CRONBOX_CGROUP_ROOT": str(root)}), registry=runtime.registry)
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
