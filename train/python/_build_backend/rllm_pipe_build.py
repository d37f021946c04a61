"""The build backend of rllm_pipe: setuptools' own (setuptools.build_meta),
run in a temporary copy of the sources.

pip builds a local directory in place (since pip 21.3), and setuptools then
leaves build/ and rllm_pipe.egg-info/ in it; a stale build/lib also carries
modules deleted since into the next wheel. Building in a copy leaves the
sources as they were, whatever builds them (pip install, pip wheel,
python -m build). Editable installs point at the sources themselves, so
they use setuptools' hooks unchanged.
"""

import contextlib
import os
import shutil
import tempfile

from setuptools import build_meta as _setuptools

# Not copied: build outputs and caches of earlier builds and test runs.
_IGNORE = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".*")


@contextlib.contextmanager
def _in_copy():
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="rllm_pipe-build-") as tmp:
        src = os.path.join(tmp, "src")
        shutil.copytree(here, src, ignore=_IGNORE)
        os.chdir(src)
        try:
            yield
        finally:
            os.chdir(here)


def get_requires_for_build_wheel(config_settings=None):
    with _in_copy():
        return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    with _in_copy():
        return _setuptools.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    out = os.path.abspath(metadata_directory)
    with _in_copy():
        return _setuptools.prepare_metadata_for_build_wheel(out, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    out = os.path.abspath(wheel_directory)
    meta = None if metadata_directory is None else os.path.abspath(metadata_directory)
    with _in_copy():
        return _setuptools.build_wheel(out, config_settings, meta)


def build_sdist(sdist_directory, config_settings=None):
    out = os.path.abspath(sdist_directory)
    with _in_copy():
        return _setuptools.build_sdist(out, config_settings)


# setuptools 64 and newer.
for _hook in ("get_requires_for_build_editable", "prepare_metadata_for_build_editable", "build_editable"):
    if hasattr(_setuptools, _hook):
        globals()[_hook] = getattr(_setuptools, _hook)
