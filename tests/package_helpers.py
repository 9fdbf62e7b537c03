"""cronbox as a host app gets it: `pip install <checkout>` into a fresh virtualenv outside the checkout.

`installed_build()` builds, once per source state, a virtualenv and a wheel under
/tmp/cronbox-test-venv-<digest>/, where <digest> covers what the package is built from (pyproject,
README, the packages, the cron script, requirements.txt, the checkout's top-level names) and this
Python. A file lock beside it lets pytest-xdist workers and later sessions share one build; pip's
cache (/tmp/cronbox-test-pip-cache) keeps the isolated build's hatchling and the dependencies'
wheels. The build runs from a copy of the checkout (hatchling writes nothing into the folder it builds
from; test_package checks that on the copy), and the copy holds every top-level file and folder (tests, bench, examples,
app.py...) so the packaging's include list is tested against all of them.

Dependencies are installed with requirements.txt as constraints: pip refuses when a range in
pyproject.toml does not accept a pinned version, and the installed versions are the tested ones.

Tests using the venv should raise their timeout (`pytest.mark.timeout(900)`): the first one waits
for the build (about a minute on a busy machine).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

CHECKOUT = Path(__file__).resolve().parents[1]
PACKAGES = ("cronbox",)  # the package's one real folder
BUILD_INPUTS = ("pyproject.toml", "README.md", "artisan_via_cron.sh", "requirements.txt", ".gitignore")
# A checkout's working files that are never part of it (.gitignore's, plus git's own).
NOT_SOURCES = (".git", ".venv", "venv", ".docs-venv", "_build", "instance", "test-artifacts", "build", "dist", "__pycache__", "*.pyc",
               "*.egg-info", ".pytest_cache", ".hypothesis", ".env", ".mypy_cache", ".ruff_cache", ".coverage*")
PREFIX = "cronbox-test-venv-"
STALE_AFTER = 2 * 86400  # other source states' builds older than this are removed
BUILD_TIMEOUT = 900


@dataclass(frozen=True)
class Build:
    root: Path  # /tmp/cronbox-test-venv-<digest>
    venv: Path
    wheel: Path
    checkout: Path  # the copy of the checkout the venv was installed from

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        out = subprocess.run([str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, env=installed_env(Path("/")))
        return Path(out.stdout.strip())


def _source_files() -> list[Path]:
    files = [CHECKOUT / name for name in BUILD_INPUTS]
    for package in PACKAGES:
        files += [p for p in (CHECKOUT / package).rglob("*")
                  if (p.is_file() or p.is_symlink()) and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sorted(files)


def sources_digest() -> str:
    digest = hashlib.sha256(sys.version.encode())
    top = sorted(p.name for p in CHECKOUT.iterdir() if not any(p.match(pattern) for pattern in NOT_SOURCES))
    digest.update("\0".join(top).encode())
    for path in _source_files():
        digest.update(str(path.relative_to(CHECKOUT)).encode() + b"\0")
        digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PIP_CACHE_DIR=str(Path(tempfile.gettempdir()) / "cronbox-test-pip-cache"),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def installed_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment of a command run with the installed cronbox: cron's bare one (PATH, HOME), nothing
    of the checkout (no PYTHONPATH) and none of cronbox's settings unless given in `extra`."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", **extra}


def installed_build() -> Build:
    root = Path(tempfile.gettempdir()) / f"{PREFIX}{sources_digest()}"
    build = Build(root=root, venv=root / "venv", wheel=root / "wheel", checkout=root / "checkout")
    with FileLock(f"{root}.lock", timeout=BUILD_TIMEOUT):
        if not (root / "ready").is_file():
            _build(build)
        os.utime(root)  # "in use": _remove_stale of another checkout's session keeps it
    _remove_stale(keep=root)
    return build


def _build(build: Build) -> None:
    shutil.rmtree(build.root, ignore_errors=True)
    build.root.mkdir(parents=True)
    shutil.copytree(CHECKOUT, build.checkout, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    _run([sys.executable, "-m", "venv", str(build.venv)])
    pip = [str(build.venv / "bin" / "python"), "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "-w", str(build.wheel), str(build.checkout)])
    _run([*pip, "install", "-c", str(build.checkout / "requirements.txt"), str(build.checkout)])
    (build.root / "ready").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=pip_env(), cwd=tempfile.gettempdir(),
                          timeout=BUILD_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed with exit {done.returncode}:\n{done.stdout}\n{done.stderr}")


def _remove_stale(keep: Path) -> None:
    """Builds of older source states, unused for STALE_AFTER: each only under its own lock, so a
    session of another checkout still using its build keeps it."""
    for other in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if other == keep or not other.is_dir() or time.time() - other.stat().st_mtime < STALE_AFTER:
            continue
        try:
            with FileLock(f"{other}.lock", timeout=0):
                shutil.rmtree(other, ignore_errors=True)
        except Timeout:
            continue
