"""The project's PEP 517 build backend: setuptools', plus mypy in the build
environment when ``AEC_COMPILE=1`` asks for the compiled kernel (setup.py)."""

from __future__ import annotations

import os
from collections.abc import Callable

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403 (every hook setuptools defines)

# mypyc ships with mypy; the version the test extra pins (pyproject.toml)
_COMPILER = ["mypy==2.4.1"]  # setup.py edits this version's generated C


def _requires(hook: Callable[..., list[str]], config_settings: object) -> list[str]:
    compiling = os.environ.get("AEC_COMPILE", "0")
    if compiling in ("", "0"):
        return list(hook(config_settings))
    # setuptools runs setup.py to list the requirements, before mypy is installed: as
    # a pure build there, then ask for mypy for the real one
    os.environ["AEC_COMPILE"] = "0"
    try:
        return list(hook(config_settings)) + _COMPILER
    finally:
        os.environ["AEC_COMPILE"] = compiling


def get_requires_for_build_wheel(config_settings: dict[str, object] | None = None) -> list[str]:
    return _requires(build_meta.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_editable(
    config_settings: dict[str, object] | None = None,
) -> list[str]:
    return _requires(build_meta.get_requires_for_build_editable, config_settings)
