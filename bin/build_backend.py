"""The project's PEP 517 build backend: setuptools', plus mypy in the build
environment when ``AEC_COMPILE=1`` asks for the compiled kernel (setup.py)."""

from __future__ import annotations

import os

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403 (every hook setuptools defines)

# mypyc ships with mypy; the version the test extra pins (pyproject.toml)
_COMPILER = ["mypy>=1.10"]


def _compiling() -> bool:
    return os.environ.get("AEC_COMPILE", "0") not in ("", "0")


def get_requires_for_build_wheel(config_settings: dict[str, object] | None = None) -> list[str]:
    extra = _COMPILER if _compiling() else []
    return list(build_meta.get_requires_for_build_wheel(config_settings)) + extra


def get_requires_for_build_editable(
    config_settings: dict[str, object] | None = None,
) -> list[str]:
    extra = _COMPILER if _compiling() else []
    return list(build_meta.get_requires_for_build_editable(config_settings)) + extra
