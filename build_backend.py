"""The build backend of pyproject.toml: setuptools' own (setuptools.build_meta), run in a temporary copy
of the checkout, so that `pip install ./cronbox` (or `pip wheel`, or a Git URL) leaves the checkout as
it was. setuptools writes `build/` and `cronbox.egg-info/` into the folder it builds in, and pip builds
in the source folder itself; it has no option for elsewhere. Only stdlib and setuptools are imported
here (pip's isolated build environment holds nothing else).

The copy leaves out what is never built: git's folder, virtualenvs, earlier build output, and the
instance folder and `.env` (a database, keys and secrets have no business in a temporary folder).
Editable installs (`pip install -e`) point at the checkout itself and are setuptools' unchanged.
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile

from setuptools import build_meta
from setuptools.build_meta import (  # noqa: F401  (editable installs build in place, as setuptools does)
    build_editable, get_requires_for_build_editable, prepare_metadata_for_build_editable,
)

NOT_BUILT = (".git", ".venv", "venv", "instance", ".env", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
             ".pytest_cache", ".hypothesis", "test-artifacts")


def _in_a_copy(hook):
    """setuptools' `hook`, run in a private copy of the checkout (0700, removed afterwards whatever
    happens); its directory arguments made absolute first, as they may be relative to the checkout."""

    @functools.wraps(hook)
    def hook_in_a_copy(*args, **kwargs):
        args = [os.path.abspath(a) if isinstance(a, str) else a for a in args]
        kwargs = {k: os.path.abspath(v) if isinstance(v, str) else v for k, v in kwargs.items()}
        source = os.getcwd()
        with tempfile.TemporaryDirectory(prefix="cronbox-build-") as folder:
            copy = os.path.join(folder, "cronbox")
            shutil.copytree(source, copy, symlinks=True, ignore=shutil.ignore_patterns(*NOT_BUILT))
            os.chdir(copy)
            try:
                return hook(*args, **kwargs)
            finally:
                os.chdir(source)

    return hook_in_a_copy


get_requires_for_build_wheel = _in_a_copy(build_meta.get_requires_for_build_wheel)
prepare_metadata_for_build_wheel = _in_a_copy(build_meta.prepare_metadata_for_build_wheel)
build_wheel = _in_a_copy(build_meta.build_wheel)
get_requires_for_build_sdist = _in_a_copy(build_meta.get_requires_for_build_sdist)
build_sdist = _in_a_copy(build_meta.build_sdist)
