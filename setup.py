"""Build script: everything else is in pyproject.toml.

By default the wheel is pure Python. With ``AEC_COMPILE=1`` in the environment the
modules in ``COMPILED`` are also compiled with mypyc (shipped with mypy; needs a C
compiler and Python's headers) and the wheel is platform-specific; the same ``.py``
files ship beside the compiled ones, and Python imports the compiled ones first.
``aec.compiled`` says which build is imported. docs/performance.md: "The compiled build".
"""

from __future__ import annotations

import os

from setuptools import setup

# The engine's per-record core: the AEC, its buffers, lanes, key accounting and epochs,
# the record context, the mailbox, the executors. The rest stays interpreted, among it
# modules tried and left out because compiled they behaved differently (the futures,
# requests and handles, MemoryBackend, the timer queue, key groups): docs/performance.md.
COMPILED = [
    "aec/runtime/buffers.py",
    "aec/runtime/controller.py",
    "aec/runtime/epochs.py",
    "aec/runtime/executor.py",
    "aec/runtime/key_accounting.py",
    "aec/runtime/lanes.py",
    "aec/runtime/mailbox.py",
    "aec/runtime/record_context.py",
]


def _ext_modules() -> list[object]:
    if os.environ.get("AEC_COMPILE", "0") in ("", "0"):
        return []
    from mypyc.build import mypycify  # AEC_COMPILE=1 needs mypy in the build environment

    return list(mypycify(COMPILED, opt_level="3", debug_level="0", group_name="aec_kernel"))


setup(ext_modules=_ext_modules())
