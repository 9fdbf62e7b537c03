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

import contextlib
import os
import shutil
import tempfile

from setuptools import build_meta
from setuptools.build_meta import (  # noqa: F401  (editable installs build in place, as setuptools does)
    build_editable, get_requires_for_build_editable, prepare_metadata_for_build_editable,
)

NOT_BUILT = (".git", ".venv", "venv", "instance", ".env", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
             ".pytest_cache", ".hypothesis", "test-artifacts")


@contextlib.contextmanager
def _in_a_copy():
    """Run the block in a private copy of the checkout (0700, removed afterwards, whatever happens)."""
    source = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="cronbox-build-") as folder:
        copy = os.path.join(folder, "cronbox")
        shutil.copytree(source, copy, symlinks=True, ignore=shutil.ignore_patterns(*NOT_BUILT))
        os.chdir(copy)
        try:
            yield
        finally:
            os.chdir(source)


def get_requires_for_build_wheel(config_settings=None):
    with _in_a_copy():
        return build_meta.get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    metadata_directory = os.path.abspath(metadata_directory)
    with _in_a_copy():
        return build_meta.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    wheel_directory = os.path.abspath(wheel_directory)
    metadata_directory = os.path.abspath(metadata_directory) if metadata_directory else None
    with _in_a_copy():
        return build_meta.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_sdist(config_settings=None):
    with _in_a_copy():
        return build_meta.get_requires_for_build_sdist(config_settings)


def build_sdist(sdist_directory, config_settings=None):
    sdist_directory = os.path.abspath(sdist_directory)
    with _in_a_copy():
        return build_meta.build_sdist(sdist_directory, config_settings)
