"""examples/clinic's own tests, run as its user runs them: a copy of the example in a folder of its own,
a virtualenv with cronbox pip-installed from this checkout and the example's requirements.txt, nothing
of the checkout on sys.path.

The virtualenv is built once per source state under /tmp/cronbox-example-venv-<digest> (the digest
covers what the package and the example's requirements are built from, and this Python), behind a
file lock shared by the xdist workers and later sessions; the build runs from a copy of the sources,
so the checkout gets no build/ or *.egg-info. MariaDB and PostgreSQL run too when TEST_MYSQL_URL and
TEST_POSTGRES_URL are set.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from filelock import FileLock, Timeout

from tests.conftest import APP_ROOT
from tests.package_helpers import BUILD_INPUTS  # one list of what a build reads

EXAMPLE = APP_ROOT / "examples" / "clinic"
PACKAGES = ("cronbox",)
EXAMPLE_REQUIREMENTS = ("requirements.txt", "requirements-test.txt")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "instance", ".env", ".pytest_cache", "build", "*.egg-info")
TIMEOUT = 900
STALE_AFTER = 2 * 86400
# Passed on to the example's tests: which database to use, and whether a missing MariaDB is a failure.
PASSED_ON = ("TEST_MYSQL_URL", "CRONBOX_REQUIRE_MYSQL", "TEST_POSTGRES_URL", "CRONBOX_REQUIRE_POSTGRES", "CI")


def sources_digest() -> str:
    digest = hashlib.sha256(sys.version.encode())
    files = [APP_ROOT / name for name in BUILD_INPUTS] + [EXAMPLE / name for name in EXAMPLE_REQUIREMENTS]
    for package in PACKAGES:
        files += [p for p in (APP_ROOT / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(files):
        digest.update(str(path.relative_to(APP_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def requirements_without_cronbox(folder: Path) -> Path:
    """The example's requirements.txt with its `cronbox @ ...` line left out: cronbox comes from this checkout."""
    lines = (EXAMPLE / "requirements.txt").read_text().splitlines()
    assert any(re.match(r"cronbox\s*@", line) for line in lines), "the example's requirements.txt names cronbox"
    kept = folder / "requirements.txt"
    kept.write_text("\n".join(line for line in lines if not re.match(r"cronbox\s*@", line)) + "\n")
    return kept


def example_test_requirements() -> list[str]:
    """The example's requirements-test.txt without its `-r requirements.txt` (installed above)."""
    lines = [line.strip() for line in (EXAMPLE / "requirements-test.txt").read_text().splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "-r"))]


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PIP_CACHE_DIR=str(Path(tempfile.gettempdir()) / "cronbox-test-pip-cache"),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=TIMEOUT, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def example_venv() -> Path:
    """The python of a virtualenv holding cronbox (from a copy of this checkout), the example's requirements
    and pytest."""
    root = Path(tempfile.gettempdir()) / f"cronbox-example-venv-{sources_digest()}"
    python = root / "venv" / "bin" / "python"
    with FileLock(f"{root}.lock", timeout=TIMEOUT):
        if not (root / "ready").is_file():
            shutil.rmtree(root, ignore_errors=True)
            source = root / "source"
            source.mkdir(parents=True)
            for name in BUILD_INPUTS:
                shutil.copy2(APP_ROOT / name, source / name)
            for package in PACKAGES:
                shutil.copytree(APP_ROOT / package, source / package, ignore=IGNORED)
            run([sys.executable, "-m", "venv", root / "venv"], env=pip_env())
            run([python, "-m", "pip", "install", "-q", "-c", source / "requirements.txt", source,
                 "-r", requirements_without_cronbox(root), *example_test_requirements()], env=pip_env(), cwd=root)
            (root / "ready").write_text("ok\n")
        os.utime(root)  # in use: another session's clean-up keeps it
    remove_stale(keep=root)
    return python


def remove_stale(keep: Path) -> None:
    """Virtualenvs of other source states unused for two days, each under its own lock (never one in use)."""
    for other in Path(tempfile.gettempdir()).glob("cronbox-example-venv-*"):
        if other == keep or not other.is_dir() or time.time() - other.stat().st_mtime < STALE_AFTER:
            continue
        try:
            with FileLock(f"{other}.lock", timeout=0):
                shutil.rmtree(other, ignore_errors=True)
        except Timeout:
            continue


# The example's tests by backend, each a test of its own so that the suite's workers run them side by side
# (one test ran all three for 7 minutes, the suite's last).
BACKEND_TESTS = {"sqlite": "not mysql and not postgresql", "mysql": "mysql", "postgresql": "postgresql"}
SERVER_URL = {"mysql": "TEST_MYSQL_URL", "postgresql": "TEST_POSTGRES_URL"}


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("store", sorted(BACKEND_TESTS))
def test_the_example_app_passes_its_tests_with_cronbox_installed(tmp_path, store):
    python = example_venv()
    clinic = tmp_path / "clinic"  # the user's copy of the example
    shutil.copytree(EXAMPLE, clinic, ignore=IGNORED)
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           **{name: os.environ[name] for name in PASSED_ON if name in os.environ}}

    where = run([python, "-c", "import cronbox, flask_sqlalchemy; print(cronbox.__file__)"], cwd=clinic, env=env)
    assert Path(where.stdout.strip()).is_relative_to(python.parent.parent), where.stdout  # the installed copy

    done = subprocess.run([python, "-m", "pytest", "-q", "--basetemp", tmp_path / "runs", "-k", BACKEND_TESTS[store],
                           "tests"], cwd=clinic, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, f"the example's tests failed:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    if store != "sqlite" and not os.environ.get(SERVER_URL[store]):
        assert "skipped" in summary, summary  # said so, in the summary
        return
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 15 and "skipped" not in summary, summary  # every test of that backend ran
