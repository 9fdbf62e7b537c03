"""The Python versions the package says it supports are the ones it does (issue 26: it said >=3.9 while
its code and its dependencies needed more). The floor is the lowest Python every pinned runtime
dependency accepts, and pyproject.toml says exactly that; `.ci/run` runs the version tests on the
newest Python too."""
from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.conftest import APP_ROOT

PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)")


def runtime_pins() -> list[str]:
    lines = (APP_ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return [m.group(1) for m in (PIN.match(line.strip()) for line in lines) if m]


def declared_floor() -> Version:
    spec = tomllib.loads((APP_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    [clause] = SpecifierSet(spec)
    assert clause.operator == ">=", spec
    return Version(clause.version)


def test_the_declared_floor_is_the_lowest_python_every_pinned_dependency_accepts():
    pins = runtime_pins()
    assert len(pins) > 10
    accepts = {name: SpecifierSet(metadata.metadata(name).get("Requires-Python") or "") for name in pins}
    floor = declared_floor()
    refusing = {name: str(spec) for name, spec in accepts.items() if not spec.contains(f"{floor}.0")}
    assert refusing == {}, f"pinned dependencies that refuse Python {floor}"
    below = Version(f"{floor.major}.{floor.minor - 1}.99")
    assert any(not spec.contains(below) for spec in accepts.values()), \
        f"every pin accepts Python {below}: the floor could be lower"


def test_this_python_is_within_the_declared_range():
    assert sys.version_info[:2] >= (declared_floor().major, declared_floor().minor)
